"""``seeupo presets``: how the algorithm presets differ, one preset's settings, or every choice's allowed values."""

from __future__ import annotations

import argparse

from seeupo.cli.common import UsageError, plugin_option


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("presets", help="the algorithm presets and how they differ",
                       description="Print a table of the settings that differ between presets, or every setting "
                                   "of one preset (NAME) or of all (--all).")
    p.add_argument("name", nargs="?", help="print every setting of this preset (built in, or registered by a --plugin)")
    p.add_argument("--all", action="store_true", help="print every setting of every preset")
    p.add_argument("--choices", action="store_true",
                   help="print the allowed values of every choice setting: the registered advantage estimators, "
                        "policy losses and aggregations (with what each needs) and the fixed choices")
    plugin_option(p)


def _print_choices() -> None:
    """Every choice field and its allowed values, read from the registries and the config's ``Literal`` types."""
    from seeupo.core.config import REGISTRIES, choices

    registries = {r.field: r for r in REGISTRIES}
    for field_name, allowed in choices().items():
        if field_name not in registries:
            print(f"{field_name}: {', '.join(allowed)}")
            continue
        registry = registries[field_name]
        print(f"{field_name} (registry: {registry.kind}):")
        for name in allowed:
            entry = registry.get(name)
            needs = [flag for flag in ("needs_critic", "needs_oracle", "needs_group_stats")
                     if getattr(entry, flag, False)]
            needs += [f"no {flag}" for flag in ("exact", "tabular", "lm") if getattr(entry, flag, True) is False]
            if getattr(entry, "surrogate", None) is False:
                needs.append("one gradient step")
            tail = f"  [{', '.join(needs)}]" if needs else ""
            print(f"  {name:<20} {entry.doc}{tail}")


def run(args: argparse.Namespace) -> int:
    from seeupo.core.config import PRESETS

    if args.name is not None and args.name not in PRESETS:
        raise UsageError(f"argument name: unknown preset {args.name!r}; choose from {sorted(PRESETS)}")
    if args.choices:
        _print_choices()
        return 0
    settings = {name: {k: v for k, v in cfg.to_dict().items() if k not in ("name", "preset")} for name, cfg in PRESETS.items()}
    if args.name or args.all:
        for name, fields in settings.items():
            if args.name and name != args.name:
                continue
            print(name)
            for key, value in fields.items():
                print(f"  {key} = {value}")
        return 0
    names = list(settings)
    keys = [k for k in settings[names[0]] if len({repr(settings[n][k]) for n in names}) > 1]
    rows = [["preset", *keys]] + [[n, *(str(settings[n][k]) for k in keys)] for n in names]
    widths = [max(len(r[i]) for r in rows) for i in range(len(keys) + 1)]
    for row in rows:
        print("  ".join(cell.ljust(w) for cell, w in zip(row, widths)).rstrip())
    print(f"\n(the {len(keys)} settings that differ; `seeupo presets NAME` or `--all` prints every setting, "
          "`--choices` the allowed values of each choice)")
    return 0
