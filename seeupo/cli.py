"""The ``seeupo`` command line.

    seeupo verify [--quick] ...            regenerate the paper's Table 1 from measurements
    seeupo exact INSTANCE.json [--policy]  exact J, J* (and with --tables the per-history tables) of an instance file
    seeupo generate ...                    write a random instance file
    seeupo presets [NAME] [--all]          the algorithm presets: how they differ, or one preset's settings
    seeupo claims [IDS] [--quick]          check every claim of the paper and the toolkit, with evidence
    seeupo search [NAMES]                  search for counterexamples (hypothesis) and save them
    seeupo check NAME [--plugin FILE]      one algorithm end to end: verify cells, searches, a bridge run; a report
    seeupo replay FILE... [--explain]      recompute counterexample (or gradient case) files, fail if they do not reproduce; why J fell
    seeupo figures [NAMES] [--quick]       regenerate the figures (figures/NAME.png and its data, NAME.json)

Bad input (a malformed file, an out-of-range flag, an unwritable ``--out``) gives one line on
stderr, ``seeupo CMD: error: [FILE: ]field 'X': PROBLEM`` or ``seeupo CMD: error: argument
--FLAG: PROBLEM``, and exit code 2, before any work starts. Errors of the toolkit itself keep
their traceback. Files are read through :mod:`seeupo.validation` (size, nesting and number
limits) and :mod:`seeupo.tabular.instances` (format and size limits).

Size limits (raise them explicitly with ``--max-cells``):

* ``seeupo generate`` refuses instances of more than :data:`MAX_CELLS` table entries (10**6,
  about 20 MB of JSON) unless ``--max-cells`` is larger.
* ``seeupo exact`` refuses instances of more than ``seeupo.tabular.instances.MAX_CELLS``
  (10**7) entries, and files over 64 MiB, unless ``--max-cells`` is larger.

``seeupo replay`` reports every file, and exits with 2 if any file was bad input, else 1 if any
recorded run did not reproduce, else 0.

``seeupo check`` exits with 1 when it measured nothing (``no learning signal``, or a ``vacuous``
bridge), with 128 + the signal's number when Ctrl-C or SIGTERM stopped it (the partial report is
written), else 0 (``J decreased`` is a finding, not a failure). ``seeupo verify`` and ``seeupo
search`` exit with 130 when Ctrl-C stopped them, after writing what finished.
"""

from __future__ import annotations

import argparse
import ast
import importlib.util
import math
import os
import signal
import sys
from pathlib import Path
from typing import NoReturn

from seeupo.core.config import PRESETS
from seeupo.tabular.families import AGENTIC_FAMILIES
from seeupo.validation import (
    InputError, comma_list, dumps, int_range, no_empty_dirs_left_on_refusal, nonnegative_float, path_arg, positive_float, positive_int, probability,
    seed_int, table_cells, writable_dir, writable_file,
)

PAPER_REPRO = Path("paper_repro")
CHECK_DIR = Path("results/check")  # seeupo check NAME writes to CHECK_DIR / NAME by default


def readable_dir(path: str, flag: str) -> Path:
    """``path`` as an existing folder, or a one-line error naming ``flag``."""
    folder = Path(path)
    if not folder.is_dir():
        raise UsageError(f"argument {flag}: {path} is not a folder")
    return folder
MAX_CELLS = 10**6  # seeupo generate's default size limit (table entries)


class UsageError(InputError):
    """A user error reported as one line with exit code 2 (no file or field to name)."""

    def __init__(self, message: str) -> None:
        super().__init__(None, message)


class Parser(argparse.ArgumentParser):
    """``argparse`` with one-line errors: ``seeupo CMD: error: MESSAGE`` and exit code 2 (no usage block)."""

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{self.prog}: error: {message}\n")


def _cmd_verify(args: argparse.Namespace) -> int:
    from seeupo.experiments.verify import QUICK, VerifyConfig, markdown, stderr_progress, verify, write_report

    base = QUICK if args.quick else VerifyConfig()
    overrides = {
        k: v
        for k, v in {
            "instances": args.instances, "iterations": args.iterations, "workers": args.workers, "seed": args.seed,
            "group_size": args.group_size, "reward_levels": args.reward_levels, "turns_mt": args.turns, "grid": args.grid,
            "modes": args.modes, "parameterizations": args.params,
            "families": None if args.families is None else tuple(f for f in args.families if f != "none"),
        }.items()
        if v is not None
    }
    if args.families is not None and "none" in args.families and len(args.families) > 1:
        raise UsageError("argument --families: 'none' stands alone (no agentic family), not beside a family")
    if args.algorithms:
        unknown = [n for n in args.algorithms if n not in PRESETS]
        if unknown:
            raise UsageError(f"argument --algorithms: unknown algorithms {unknown}; choose from {sorted(PRESETS)} "
                             "(--plugin FILE adds the presets a plugin registers)")
        _check_tabular(args.algorithms, "--algorithms")
        # the algorithms' own counterexamples: --counterexamples, and each one's default check folder if it exists
        folders = [str(readable_dir(d, "--counterexamples")) for d in args.counterexamples]
        folders += [str(CHECK_DIR / n) for n in args.algorithms if (CHECK_DIR / n / "counterexamples").is_dir()]
        overrides |= {"algorithms": tuple(args.algorithms), "plugins": args.plugins_loaded,
                      "algorithm_counterexamples": tuple(dict.fromkeys(folders))}
    elif args.counterexamples:
        raise UsageError("argument --counterexamples: needs --algorithms (Table 1 replays the committed counterexamples)")
    cfg = base.__class__(**{**base.__dict__, **overrides})
    histories = cfg.instances * (cfg.vocab_size ** cfg.length) ** cfg.turns_mt if cfg.turns_mt <= 32 else MAX_CELLS + 1
    if histories > MAX_CELLS:
        raise UsageError(f"argument --turns: {cfg.turns_mt} turns of {cfg.vocab_size ** cfg.length} actions for "
                         f"{cfg.instances} instances make more than {MAX_CELLS} histories")
    levels, g = cfg.reward_levels, cfg.group_size
    if math.comb(levels + g - 2, g - 1) > MAX_CELLS:
        raise UsageError(f"argument --group-size: an exact GRAE batch with G = {g} and {levels} reward levels could need "
                         f"more than {MAX_CELLS} rows; lower --group-size or --reward-levels")
    if args.algorithms:  # a broken estimator is named now, before a folder or a worker process exists
        _check_exact_contract(args.algorithms, cfg.group_size)
    out = writable_dir(args.out, "--out")  # refused later (a plugin breaking its contract in a cell): removed again
    report = verify(cfg, progress=None if args.no_progress else stderr_progress)
    json_path, md_path = write_report(report, out)
    print(markdown(report))
    print(f"Wrote {json_path} and {md_path}.")
    return 130 if report.get("partial") else 0  # Ctrl-C: the cells that finished are written, marked partial


def _check_exact_contract(names: list[str] | tuple[str, ...], group_size: int) -> None:
    """Call each algorithm's estimator through exact mode's contract checks (seeupo.core.contract): a function
    that raises or breaks the boundary's checks is one line (PluginError) before any work starts."""
    from seeupo.core.contract import exact_mode_refusal

    for name in names:
        exact_mode_refusal(PRESETS[name].replace(group_size=group_size))


def _check_tabular(names: list[str], flag: str) -> None:
    """Refuse algorithms whose estimator the tabular engine cannot run (registered with tabular=False)."""
    from seeupo.core.registry import adv_estimator

    off = [n for n in names if not adv_estimator(PRESETS[n].advantage).tabular]
    if off:
        raise UsageError(f"argument {flag}: {off} use an advantage estimator registered with tabular=False")


def _cmd_exact(args: argparse.Namespace) -> int:
    from seeupo.tabular.exact import evaluate, optimal
    from seeupo.tabular.instances import load_policy, load_problem
    from seeupo.tabular.policies import uniform_probs

    problem = load_problem(args.instance, max_cells=args.max_cells)
    probs = load_policy(args.policy, problem, max_cells=args.max_cells) if args.policy else uniform_probs(problem)
    ev, opt = evaluate(problem, probs), optimal(problem)
    out = {
        "J_star": float(opt.J[0]),
        "J": float(ev.J[0]),
        "gap": float(opt.J[0] - ev.J[0]),
        "policy": args.policy or "uniform",
        "histories_per_turn": [problem.num_histories(t) for t in range(problem.num_turns)],
    }
    if args.tables:
        out |= {
            "optimal_actions": [p[0].argmax(-1).tolist() for p in opt.policy],
            "V_star_initial": opt.V[0][0].tolist(),
            "V_initial": ev.V[0][0].tolist(),
        }
    print(dumps(out))
    return 0


def generated_cells(args: argparse.Namespace) -> int:
    """Table entries of the instance ``seeupo generate`` would write (computed without building it)."""
    if args.kind == "sequential_bandit":
        actions = args.vocab_size**args.length if args.length > 1 else args.actions
        return table_cells(args.initial_states, (actions,) * args.turns)
    return table_cells(args.initial_states, (args.actions,) * args.turns, (args.observations,) * args.turns)


def _cmd_generate(args: argparse.Namespace) -> int:
    if args.length > 1 and args.length * (args.vocab_size.bit_length()) > 64:
        raise UsageError(f"argument --length: {args.length} tokens from a vocabulary of {args.vocab_size} spell too many actions")
    if args.turns > 64:
        raise UsageError("argument --turns: at most 64")
    cells = generated_cells(args)
    if cells > args.max_cells:
        raise UsageError(f"the instance these sizes ask for (--turns, --actions, ...) would have {cells:.3g} table entries, "
                         f"more than --max-cells {args.max_cells}; choose smaller sizes or raise --max-cells")
    out = writable_file(args.out, "--out") if args.out else None

    import torch

    from seeupo.tabular.instances import problem_to_dict
    from seeupo.tabular.problems import random_sequential_bandit, random_tree_mdp

    gen = torch.Generator().manual_seed(args.seed)
    actions = tuple([args.actions] * args.turns)
    if args.kind == "sequential_bandit":
        tokens = (args.vocab_size, args.length) if args.length > 1 else None
        if tokens is not None:
            actions = tuple([args.vocab_size**args.length] * args.turns)
        problem = random_sequential_bandit(
            1, actions, num_initial_states=args.initial_states, reward_levels=args.reward_levels, tokens=tokens, generator=gen
        )
    else:
        problem = random_tree_mdp(
            1, actions, tuple([args.observations] * args.turns), num_initial_states=args.initial_states,
            terminate_prob=args.terminate_prob, gamma=args.gamma, reward_levels=args.reward_levels, generator=gen,
        )
    text = dumps(problem_to_dict(problem))
    if out is not None:
        out.write_text(text + "\n")
        print(f"Wrote {out}.")
    else:
        print(text)
    return 0


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


def _cmd_presets(args: argparse.Namespace) -> int:
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


def _cmd_claims(args: argparse.Namespace) -> int:
    from seeupo.experiments.claims import CLAIMS, DEFAULT, QUICK, check_all, markdown

    unknown = sorted(set(args.ids) - {c.id for c in CLAIMS})
    if unknown:
        raise UsageError(f"argument ids: unknown claims {unknown}; choose from {[c.id for c in CLAIMS]}")
    out = writable_dir(args.out, "--out")
    budget = QUICK if args.quick else DEFAULT
    report = check_all(budget, ids=args.ids or None, progress=None if args.no_progress else (lambda m: print(m, file=sys.stderr, flush=True)))
    (out / "claims.json").write_text(dumps(report, indent=1) + "\n")
    (out / "claims.md").write_text(markdown(report))
    width = max(len(e["id"]) for e in report["claims"])
    for e in report["claims"]:
        print(f"{e['id']:{width}s}  {e['status']}\n{'':{width}s}  {e['summary']}")
    print(f"Wrote {out / 'claims.json'} and {out / 'claims.md'}.")
    return 0


def _cmd_replay(args: argparse.Namespace) -> int:
    from seeupo.experiments.counterexamples import Counterexample, replay
    from seeupo.experiments.gradient_check import is_gradient_file

    bad = failed = 0
    for path in args.files:
        if is_gradient_file(path):  # a gradient case (seeupo check's gradient/ folder)
            outcome = _replay_gradient(path)
            bad, failed = bad + (outcome == 2), failed + (outcome == 1)
            continue
        try:
            example = Counterexample.load(path)
        except InputError as err:
            bad += 1
            print(f"seeupo replay: error: {err}", file=sys.stderr)
            continue
        result = replay(example, atol=args.atol)
        j = " -> ".join(f"{x:.9f}" for x in result.recomputed)
        if result.reproduces:
            print(f"{path}: reproduced (claim {example.claim}): J {j}, J* {example.J_star:.6f}, "
                  f"largest decrease {example.largest_decrease:.3e}")
        else:
            failed += 1
            rec = " -> ".join(f"{x:.9f}" for x in result.recorded)
            print(f"{path}: DOES NOT REPRODUCE: recorded J {rec}, recomputed {j} (max difference {result.max_abs_diff:.3e})")
        if args.explain:  # why J fell, step by step (seeupo.experiments.explain)
            from seeupo.experiments.explain import explain, render

            print("\n" + render(explain(example)))
    return 2 if bad else 1 if failed else 0


def _replay_gradient(path: str) -> int:
    """Recompute one gradient case file and print the outcome: 0 reproduced, 1 not, 2 bad input."""
    from seeupo.experiments.gradient_check import load_case, replay_case

    try:
        case = load_case(path)
    except InputError as err:
        print(f"seeupo replay: error: {err}", file=sys.stderr)
        return 2
    ok, now = replay_case(case)
    cosines = ", ".join("undefined" if c is None or c != c else f"{c:.6f}" for c in now["turn_cosines"])
    if ok:
        print(f"{path}: reproduced: expected update {now['verdict']} (cosine per turn {cosines})")
        return 0
    print(f"{path}: DOES NOT REPRODUCE: recorded {case.recorded['verdict']}, recomputed {now['verdict']} "
          f"(cosine per turn {cosines})")
    return 1


def search_names() -> list[tuple[str, str]]:
    """``(name, description)`` of every registered search, read from the source of
    :mod:`seeupo.experiments.searches` without importing it (it imports hypothesis and torch,
    which would make ``seeupo search --help`` take seconds). ``tests/test_cli.py`` checks that
    this list equals the registry."""
    spec = importlib.util.find_spec("seeupo.experiments.searches")
    tree = ast.parse(Path(spec.origin).read_text())
    out = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and getattr(node.func, "id", None) == "SearchSpec" and len(node.args) >= 3:
            try:
                name, _claim, description = (ast.literal_eval(a) for a in node.args[:3])
            except ValueError:  # a spec built from variables (algorithm_searches) is not one of the registered
                continue
            out.append((name, description))
    return out


def _cmd_search(args: argparse.Namespace) -> int:
    if args.algorithm is not None:
        if args.algorithm not in PRESETS:
            raise UsageError(f"argument --algorithm: unknown algorithm {args.algorithm!r}; choose from {sorted(PRESETS)} "
                             "(--plugin FILE adds the presets a plugin registers)")
        _check_tabular([args.algorithm], "--algorithm")
        from seeupo.core.contract import exact_mode_refusal

        reason = exact_mode_refusal(PRESETS[args.algorithm])  # the searches run exact mode only
        if reason is not None:
            raise UsageError(f"argument --algorithm: {args.algorithm}: exact: refused ({reason}); the searches run "
                             "exact mode only (seeupo verify --algorithms runs its sampled cells)")
        if args.names:
            raise UsageError("argument names: give search names or --algorithm, not both")
        if args.update_paper_repro:
            raise UsageError("argument --update-paper-repro: the committed searches are the paper's; "
                             "write an algorithm's searches to --out")
    known = [name for name, _ in search_names()]
    unknown = [n for n in args.names if n not in known]
    if unknown:
        raise UsageError(f"argument names: unknown searches {unknown}; choose from {known}")
    if args.update_paper_repro:
        out_dir, index = PAPER_REPRO / "counterexamples", PAPER_REPRO / "searches.json"
        writable_dir(out_dir, "--update-paper-repro")
    else:
        out_dir = writable_dir(args.out, "--out")
        index = out_dir / "searches.json"
    existing = {}
    if index.exists():
        from seeupo.validation import read_json

        entries = read_json(index)
        if not isinstance(entries, list) or not all(isinstance(e, dict) and isinstance(e.get("search"), str) for e in entries):
            raise InputError(None, "must be a list of search entries; move it away to start a new one", str(index))
        existing = {e["search"]: e for e in entries}

    from seeupo.experiments.counterexamples import search
    from seeupo.experiments.searches import SEARCHES, algorithm_searches, get
    from seeupo.experiments.verdicts import search_outcome

    if args.algorithm is not None:
        specs = algorithm_searches(args.algorithm)
    else:
        specs = [get(name) for name in args.names] if args.names else SEARCHES
    if not args.update_paper_repro:  # an earlier run's counterexample is never replaced (the committed ones are, on purpose)
        taken = [str(out_dir / f"{spec.name}.json") for spec in specs if (out_dir / f"{spec.name}.json").exists()]
        if taken:
            raise UsageError(f"argument --out: {', '.join(taken)} already exist (an earlier search); choose another --out")
    summary = []
    for spec in specs:
        budget = args.max_examples or spec.max_examples
        print(f"searching {spec.name} ({budget} examples) ...", file=sys.stderr, flush=True)
        result = search(spec.cases(), claim=spec.claim, description=spec.description, max_examples=budget, seed=args.seed,
                        keep_on_interrupt=True, setting=spec.setting)
        entry = {"search": spec.name, "claim": spec.claim, "description": spec.description, "examples": result.examples,
                 "max_examples": budget, "seed": args.seed, "found": result.found is not None, "moved": result.moved}
        if args.plugins_loaded:
            entry["plugins"] = list(args.plugins_loaded)
        if result.found is not None:
            path = out_dir / f"{spec.name}.json"
            result.found.save(path)
            entry |= {"file": str(path), "J": result.found.J, "largest_decrease": result.found.largest_decrease}
            print(f"{spec.name}: {search_outcome(entry)}; saved {path}")
        else:
            print(f"{spec.name}: {search_outcome(entry)}")
        summary.append(entry)
        if result.stopped == "interrupted":  # Ctrl-C: keep what was found, record it, stop
            entry["stopped"] = "interrupted"
            break
    existing |= {e["search"]: e for e in summary}
    index.write_text(dumps(list(existing.values()), indent=1) + "\n")
    return 130 if summary and summary[-1].get("stopped") == "interrupted" else 0


def _cmd_check(args: argparse.Namespace) -> int:
    from seeupo.experiments.check import DEFAULT, QUICK, check, compare, prepare_output, summary_line

    if args.name not in PRESETS:
        raise UsageError(f"argument name: unknown algorithm {args.name!r}; choose from {sorted(PRESETS)} "
                         "(--plugin FILE adds the presets a plugin registers)")
    _check_tabular([args.name], "name")
    names = [args.name]
    if args.compare is not None:  # every name is checked before anything runs or a folder is made
        others = [n.strip() for n in args.compare.split(",") if n.strip()]
        unknown = [n for n in others if n not in PRESETS]
        if unknown or not others:
            raise UsageError(f"argument --compare: unknown algorithms {unknown}; choose from {sorted(PRESETS)}" if unknown
                             else "argument --compare: expected a comma-separated list of algorithms, e.g. grpo,seeupo")
        _check_tabular(others, "--compare")
        names = list(dict.fromkeys([args.name, *others]))
    budget = QUICK if args.quick else DEFAULT
    _check_exact_contract(names, budget.verify.group_size)  # a broken estimator: one line, no folder
    out_arg = args.out or str(CHECK_DIR / args.name)
    out = writable_dir(out_arg, "--out")  # a file there is one line, not a traceback; removed again if refused
    say = (lambda m: None) if args.no_progress else (lambda m: print(m, file=sys.stderr, flush=True))
    moved = prepare_output(out, args.overwrite, lambda m: print(m, file=sys.stderr, flush=True))  # said even with --no-progress
    if args.max_examples:  # the cases asked for, not fewer to fit the default budget (an explicit --budget still fits)
        budget = budget.__class__(**{**budget.__dict__, "max_examples": args.max_examples, "seconds": None})
    if args.budget is not None:
        budget = budget.__class__(**{**budget.__dict__, "seconds": args.budget})
    if len(names) > 1:
        result = compare(names, budget, out, plugins=args.plugins_loaded, seed=args.seed, bridge=not args.no_bridge,
                         say=say, moved_aside=moved)
    else:
        report = check(args.name, budget, out, plugins=args.plugins_loaded, seed=args.seed, bridge=not args.no_bridge,
                       say=say, moved_aside=moved)
    if len(names) > 1:
        return _compare_exit(result, out, args.fail_on_decrease)
    print(summary_line(report))
    print(f"Wrote {out / 'check.md'}, {out / 'check.json'} and {out / 'check.png'}.")
    return check_status(report, report, args.fail_on_decrease)


def check_status(run: dict, checked: dict, fail_on_decrease: bool) -> int:
    """The exit status of a finished check: ``run`` its report (one algorithm's, or a comparison's),
    ``checked`` the checked algorithm's own report. 128 + N when stopped by signal N (as the shell
    reports it); 1 when the evidence is empty (a vacuous bridge, no learning signal) or, with
    ``fail_on_decrease``, when ``J`` decreased; else 0."""
    if run.get("partial"):
        return 128 + int(getattr(signal, run["partial"], signal.SIGINT))
    if run["bridge"].get("vacuous"):  # a bridge that could not learn is no evidence: say so in the exit status
        print(f"seeupo check: the bridge is vacuous: {run['bridge']['vacuous']}", file=sys.stderr)
        return 1
    measured = checked["monotonicity"]["measured"]
    if measured == "no learning signal":  # a check that measured nothing is no pass either
        return 1
    if fail_on_decrease and measured == "J decreased":
        print("seeupo check: J decreased (--fail-on-decrease)", file=sys.stderr)
        return 1
    return 0


def _compare_exit(result: dict, out: Path, fail_on_decrease: bool) -> int:
    """Print one summary line per compared algorithm; the exit status as for one check, of the first (the checked) one."""
    from seeupo.experiments.check import summary_line

    for report in result["algorithms"].values():
        print(summary_line(report))
    print(f"Wrote {out / 'check.md'}, {out / 'check.json'} and {out / 'check.png'} (each algorithm's own report in "
          f"{out / 'algorithms'}).")
    return check_status(result, result["algorithms"][result["compare"][0]], fail_on_decrease)


def _require_llm_extra() -> None:
    try:
        import transformers  # noqa: F401
    except ImportError:
        raise InputError(None, "needs the language-model extra: pip install 'seeupo[llm]'") from None


def _cmd_train(args: argparse.Namespace) -> int:
    _require_llm_extra()
    from seeupo.core.contract import dry_run
    from seeupo.llm.checkpoint import checkpoint_step, latest_checkpoint, saved_run_config
    from seeupo.llm.config import check_for_training, load_train_config, resume_changes
    from seeupo.llm.build import check_model_name
    from seeupo.llm.distributed import launched_by_torchrun, shutdown
    from seeupo.llm.trainer import Trainer

    overrides = list(args.set) + ([f"out_dir={args.out}"] if args.out else [])
    cfg = load_train_config(args.config, overrides, args.plugin)
    check_for_training(cfg)
    # a broken plugin is named before the run folder exists (else it would hold a config and a partial log)
    dry_run(cfg.algorithm)
    # every check of the run folder comes before it is created or a model is loaded
    out = Path(cfg.out_dir)
    checkpoint = latest_checkpoint(out / "checkpoints") if out.is_dir() else None
    if args.resume and checkpoint is None:
        what = "does not exist" if not out.exists() else "holds no checkpoint"
        raise InputError(None, f"argument --resume: {out} {what}, so there is nothing to resume; "
                               "--resume-if-possible starts a fresh run when there is no checkpoint")
    saved = saved_run_config(out) if out.is_dir() else None
    if saved is not None or _holds_run(out):
        if not (args.resume or args.resume_if_possible):
            raise InputError(None, f"argument --out: {out} already holds a run; pass --resume to continue it or choose another out_dir")
        if saved is not None:
            resume_changes(saved, cfg)  # refuses a config that would make it another run
    if checkpoint is not None and checkpoint_step(checkpoint) >= cfg.steps:
        print(f"seeupo train: {out} is complete (its newest checkpoint is step {checkpoint_step(checkpoint)} of "
              f"steps {cfg.steps}); nothing to train, nothing written. --set steps=N continues it to step N.")
        return 0
    check_model_name(cfg.model.name)
    _refuse_liger_where_it_cannot_run(cfg)
    out = writable_dir(out, "--out")
    env = None
    if launched_by_torchrun():  # torchrun --nproc-per-node N -m seeupo train ...: FSDP2 data parallelism
        from seeupo.llm.distributed import init_distributed

        env = init_distributed()
    try:
        return _train(cfg, args, Trainer(cfg, dist=env, check_prompts=True), out, resume=checkpoint is not None)
    finally:
        if env is not None:
            shutdown()


def _refuse_liger_where_it_cannot_run(cfg) -> None:
    """``optim.logprobs`` / ``optim.layer_kernels: liger`` where the run will not have CUDA (one process
    trains on the CPU; under torchrun each process on its GPU, where there is one), or layer kernels
    liger has none of for the model's type: one line, before the run folder exists or the model is
    loaded and warmed up, not a traceback at the first pass."""
    import torch

    from seeupo.llm.build import model_type
    from seeupo.llm.distributed import launched_by_torchrun
    from seeupo.llm.kernels import model_type_unsupported
    from seeupo.llm.logprobs import liger_unavailable

    reason = liger_unavailable("cuda" if launched_by_torchrun() and torch.cuda.is_available() else "cpu")
    for field in ("logprobs", "layer_kernels"):
        if getattr(cfg.optim, field) == "liger" and reason is not None:
            raise InputError(f"config.optim.{field}", f"'liger' cannot run: {reason}")
    kind = model_type(cfg.model.name)  # None: a folder whose config.json does not say; checked once loaded
    if cfg.optim.layer_kernels == "liger" and kind is not None:
        unsupported = model_type_unsupported(kind)
        if unsupported is not None:
            raise InputError("config.optim.layer_kernels", f"'liger' cannot run: {unsupported}")


def _holds_run(out: Path) -> bool:
    """Whether ``out`` holds (part of) a run: its metrics, config or checkpoints."""
    from seeupo.llm.metrics import METRICS_FILE

    return any((out / name).exists() for name in (METRICS_FILE, "config.yaml", "checkpoints"))


# written into a run folder when a plugin broke its contract during the run: the error's one line and the step
FAILED_FILE = "failed.txt"


def _train(cfg, args: argparse.Namespace, trainer, out: Path, *, resume: bool) -> int:
    from seeupo.core.boundary import PluginError
    from seeupo.llm.metrics import METRICS_FILE
    from seeupo.llm.trainer import TrainingDiverged

    say = print if trainer.is_main else (lambda *a, **k: None)
    progress = not args.no_progress and cfg.logging.progress
    if progress and trainer.is_main:
        from tqdm import tqdm

        say = tqdm.write
    try:
        for metrics in trainer.run(resume=resume, progress=progress):
            shown = {k: metrics[k] for k in ("critic/score/mean", "bridge/J", "bridge/J_star", "actor/kl_loss") if k in metrics}
            say("  ".join([f"step {trainer.step_count}"] + [f"{k} {v:.4f}" for k, v in shown.items()]))
    except TrainingDiverged as err:
        if trainer.is_main:
            print(f"seeupo train: stopped: {err}", file=sys.stderr)
        return 1
    except PluginError as err:
        # a plugin that broke only after the run began (the dry run before it passed): the folder already holds
        # config.yaml and the steps logged so far, so it is marked as a finished, failed run
        if trainer.is_main and out.is_dir():
            (out / FAILED_FILE).write_text(f"failed at step {trainer.step_count + 1}: {err}\n")
        raise
    say(f"Wrote {out / METRICS_FILE} and checkpoints under {out / 'checkpoints'}.")
    return 0


def _cmd_eval(args: argparse.Namespace) -> int:
    _require_llm_extra()
    from seeupo.llm.build import check_model_name
    from seeupo.llm.checkpoint import latest_checkpoint, load_checkpoint, load_model_weights
    from seeupo.llm.config import load_train_config
    from seeupo.llm.evaluate import EPISODES, check_output, eval_settings, evaluate_policy, markdown, start_output
    from seeupo.llm.trainer import Trainer

    cfg = load_train_config(args.config, list(args.set), args.plugin)
    check_model_name(cfg.model.name)
    out = writable_dir(args.out, "--out")
    checkpoint = None
    if args.checkpoint is not None:
        path = Path(args.checkpoint)
        checkpoint = path if (path / "state.pt").exists() else latest_checkpoint(path / "checkpoints" if (path / "checkpoints").is_dir() else path)
        if checkpoint is None:
            raise InputError(None, f"argument --checkpoint: no checkpoint in {path} (expected a run folder or a checkpoints/step_N folder)")
    settings = eval_settings(cfg, args.k, checkpoint, args.max_tasks, args.batch)
    check_output(out, settings, resume=args.resume, overwrite=args.overwrite)  # before the model loads
    trainer = Trainer(cfg, prepare=checkpoint is None)
    if checkpoint is not None:
        load_model_weights(checkpoint, trainer.model)
        trainer.step_count = load_checkpoint(checkpoint)["trainer"]["step"]
    start_output(out, settings, resume=args.resume)
    try:
        scores = evaluate_policy(trainer, args.k, out, batch=args.batch, max_tasks=args.max_tasks,
                                 progress=not args.no_progress, resume=args.resume)
    except KeyboardInterrupt:  # what finished is on disk; say how to continue instead of a traceback
        kept = sum(1 for _ in (out / EPISODES).open()) if (out / EPISODES).exists() else 0
        print(f"seeupo eval: interrupted; {kept} finished episodes are in {out / EPISODES}; "
              "the same command with --resume continues", file=sys.stderr)
        return 130
    print(markdown(scores, args.k), end="")
    print(f"Wrote {out / EPISODES}, {out / 'summary.json'} and {out / 'summary.md'}.")
    return 0


def _cmd_figures(args: argparse.Namespace) -> int:
    from seeupo.figures import FIGURES
    import time

    from seeupo.figures._common import regenerate

    unknown = [n for n in args.names if n not in FIGURES]
    if unknown:
        raise UsageError(f"argument names: unknown figures {unknown}; choose from {list(FIGURES)}")
    out = writable_dir(args.out, "--out")
    start = time.perf_counter()
    names = args.names or list(FIGURES)
    regenerate(names, quick=args.quick, out=out, plot_only=args.plot_only, seed=args.seed, runs=args.runs,
               log=lambda m: print(m, flush=True))
    print(f"Wrote {len(names)} figure{'' if len(names) == 1 else 's'} (PNG and JSON) to {out} in {time.perf_counter() - start:.1f} s.")
    return 0


def _plugin_option(p: argparse.ArgumentParser) -> None:
    """``--plugin``, the same on every command that reads an algorithm (seeupo.plugins)."""
    p.add_argument("--plugin", action="append", default=[], metavar="PATH_OR_MODULE",
                   help="a .py file or module name to import first, so that the command may name the algorithms, "
                        "advantage estimators, policy losses and aggregations it registers (repeatable; for train "
                        "and eval it adds to the config's plugins:); installed packages' plugins (entry-point group "
                        "seeupo.plugins) are always loaded")


def build_parser() -> argparse.ArgumentParser:
    parser = Parser(prog="seeupo", description="SeeUPO verification toolkit.")
    sub = parser.add_subparsers(dest="command", required=True)

    p = sub.add_parser("verify", help="regenerate the paper's Table 1 from tabular measurements",
                       description="Run the verification grid on random tabular problems and compare with the paper's Table 1.")
    p.add_argument("--quick", action="store_true", help="a small run (exact mode, independent parameters only)")
    p.add_argument("--grid", choices=["table1", "full"], help="table1 (default): the paper's rows; full: every advantage x every update")
    p.add_argument("--instances", type=int_range(1, 100_000), help="random problems per cell, 1 to 100000")
    p.add_argument("--iterations", type=int_range(1, 100_000), help="iterations per run, 1 to 100000")
    p.add_argument("--turns", type=positive_int, help="turns of the multi-turn setting")
    p.add_argument("--group-size", type=int_range(2, 1024), help="G, 2 to 1024, rollouts per task for GRAE")
    p.add_argument("--reward-levels", type=int_range(2, 10**6), help="rewards on this many levels in [0, 1] (2 = binary)")
    p.add_argument("--modes", type=comma_list(("exact", "sampled")), help="comma-separated: exact,sampled")
    p.add_argument("--params", type=comma_list(("independent", "shared")), help="comma-separated: independent,shared")
    p.add_argument("--families", type=comma_list((*AGENTIC_FAMILIES, "none")),
                   help="agentic problem families run beside ST and MT (exact mode), comma-separated: "
                        + ",".join(AGENTIC_FAMILIES) + " (default: all), or none")
    p.add_argument("--workers", type=int_range(1, 256), help="worker processes, 1 to 256 (default 2)")
    p.add_argument("--seed", type=seed_int, help="seed of the random problems and runs")
    p.add_argument("--out", type=path_arg, default="results/verify", help="folder for verify.json and verify.md (default: results/verify)")
    p.add_argument("--algorithms", type=comma_list(None), metavar="NAME,...",
                   help="registered algorithms (presets; a plugin's too) to run instead of the grid")
    p.add_argument("--counterexamples", action="append", default=[], metavar="DIR",
                   help="with --algorithms: also replay the counterexamples in DIR (a folder of counterexample files, "
                        "or a seeupo check folder) whose algorithm is one of them; one that lowers J makes its cells "
                        "'J decreased' (repeatable; results/check/NAME is always consulted when it exists)")
    _plugin_option(p)
    p.add_argument("--no-progress", action="store_true", help="do not print per-cell progress to stderr")
    p.set_defaults(func=_cmd_verify)

    p = sub.add_parser("exact", help="exact J and J* of an instance file",
                       description="Print J* (backward induction) and J of a policy (uniform by default) as one JSON object.")
    p.add_argument("instance", help="instance JSON file (format: seeupo.tabular.instances)")
    p.add_argument("--policy", help='policy JSON file {"action_probs": [...]} (default: uniform)')
    p.add_argument("--tables", action="store_true",
                   help="also print the per-history tables: optimal actions, V* and V of the initial states")
    p.add_argument("--max-cells", type=positive_int, default=10**7,
                   help="refuse instances with more table entries than this (default 10**7; larger files are allowed in proportion)")
    p.set_defaults(func=_cmd_exact)

    p = sub.add_parser("generate", help="write a random instance file", description="Write a random instance as JSON.")
    p.add_argument("--kind", choices=["sequential_bandit", "tree_mdp"], default="sequential_bandit")
    p.add_argument("--turns", type=positive_int, default=2)
    p.add_argument("--actions", type=positive_int, default=3, help="actions per turn (ignored with --length > 1)")
    p.add_argument("--vocab-size", type=positive_int, default=2, help="token vocabulary (with --length > 1)")
    p.add_argument("--length", type=positive_int, default=1, help="tokens per action (sequential bandit only)")
    p.add_argument("--observations", type=positive_int, default=2, help="observations per turn (tree MDP)")
    p.add_argument("--initial-states", type=positive_int, default=1)
    p.add_argument("--terminate-prob", type=probability, default=0.2, help="early termination probability in [0, 1] (tree MDP)")
    p.add_argument("--gamma", type=probability, default=1.0, help="discount in [0, 1] (tree MDP)")
    p.add_argument("--reward-levels", type=int_range(2, 10**6), default=None,
                   help="rewards on this many levels, 2 to 10**6 (default: uniform in [0, 1])")
    p.add_argument("--seed", type=seed_int, default=0)
    p.add_argument("--max-cells", type=positive_int, default=MAX_CELLS,
                   help=f"refuse instances with more table entries than this (default {MAX_CELLS}, about 20 MB of JSON)")
    p.add_argument("--out", type=path_arg, help="output file (default: stdout)")
    p.set_defaults(func=_cmd_generate)

    p = sub.add_parser("claims", help="check every claim and print its verdict with evidence",
                       description="Run the check of every registered claim (seeupo.experiments.claims) and report the verdicts.")
    p.add_argument("ids", nargs="*", help="only these claims (default: all)")
    p.add_argument("--quick", action="store_true", help="small budgets (for a quick look; verdicts may be inconclusive)")
    p.add_argument("--out", type=path_arg, default="results/claims", help="folder for claims.json and claims.md (default: results/claims)")
    p.add_argument("--no-progress", action="store_true", help="do not print per-claim progress to stderr")
    p.set_defaults(func=_cmd_claims)

    p = sub.add_parser("replay", help="recompute counterexample files and check the recorded numbers",
                       description="Recompute each counterexample from scratch and report every file. Exit code: 2 if any "
                                   "file was bad input, else 1 if any recorded J did not reproduce, else 0.")
    p.add_argument("files", nargs="+", help="counterexample JSON files")
    p.add_argument("--atol", type=nonnegative_float, default=1e-8, help="tolerance on each J, >= 0 (default 1e-8)")
    p.add_argument("--explain", action="store_true",
                   help="also explain each file: the instance, the advantages, the update, and why J fell")
    _plugin_option(p)
    p.set_defaults(func=_cmd_replay)

    listing = "\n".join(f"  {name}\n      {description}" for name, description in search_names())
    p = sub.add_parser("search", help="search for counterexamples with hypothesis",
                       description="Run the registered counterexample searches and save what they find.",
                       epilog=f"searches:\n{listing}", formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("names", nargs="*", help="searches to run (default: all; listed below)")
    p.add_argument("--algorithm", metavar="NAME",
                   help="run the generic monotonicity searches of this registered algorithm (a preset; a plugin's too) "
                        "instead of the paper's searches")
    _plugin_option(p)
    p.add_argument("--max-examples", type=positive_int, help="cases per search, >= 1 (default: each search's own budget)")
    p.add_argument("--seed", type=seed_int, default=0)
    p.add_argument("--out", type=path_arg, default="results/search",
                   help="folder for the counterexample files and searches.json, the summary of every search run (default: results/search)")
    p.add_argument("--update-paper-repro", action="store_true",
                   help=f"write into the committed {PAPER_REPRO}/counterexamples and {PAPER_REPRO}/searches.json instead of --out")
    p.set_defaults(func=_cmd_search)

    p = sub.add_parser("check", help="check one algorithm: verify cells, counterexample searches, a bridge run; a report",
                       description="For a registered algorithm (a preset, or one a --plugin registers): the verify cells "
                                   "(exact J on random problems), the generic monotonicity searches, and a short "
                                   "language-model run on the bridge with exact J per step; writes OUT/check.md, "
                                   "check.json and check.png (seeupo.experiments.check).")
    p.add_argument("name", help="the algorithm: a preset name (seeupo presets lists them)")
    _plugin_option(p)
    p.add_argument("--quick", action="store_true", help="small sizes (about a minute without the bridge): for a first look")
    p.add_argument("--max-examples", type=positive_int, help="cases per search (default 150, fewer to fit the budget; --quick 8); "
                                                              "given alone, the default budget is not applied")
    p.add_argument("--no-bridge", action="store_true", help="skip the language-model run")
    p.add_argument("--compare", metavar="A,B",
                   help="also check these algorithms (comma-separated) on the same problems, seeds, searches and bridge, "
                        "and report them side by side; the budget covers them all, split equally")
    p.add_argument("--seed", type=seed_int, default=0, help="seed of the problems, searches and runs (default 0)")
    p.add_argument("--out", type=path_arg, help="the report's folder (default: results/check/NAME); it must be empty unless --overwrite")
    p.add_argument("--budget", type=positive_float, metavar="SECONDS",
                   help="fit the whole check in about this many seconds (fewer verify iterations and search cases; "
                        "default: 170 s, or none with --quick)")
    p.add_argument("--overwrite", action="store_true",
                   help="move an earlier check's files in --out into previous-<time>/ first (nothing is deleted)")
    p.add_argument("--fail-on-decrease", action="store_true",
                   help="exit 1 when the measured verdict is 'J decreased' (default: 0 whatever the verdict, 1 only "
                        "when the evidence is empty), to gate a CI job on it")
    p.add_argument("--no-progress", action="store_true", help="do not print progress to stderr")
    p.set_defaults(func=_cmd_check)

    p = sub.add_parser("train", help="train a language model on a multi-turn environment",
                       description="Train a causal LM with any preset (seeupo.llm.trainer). The YAML config and "
                                   "its fields are documented in seeupo/llm/config.py; configs/ has examples.")
    p.add_argument("config", nargs="?", help="YAML run config (default: the built-in defaults)")
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                   help="override a config field, e.g. --set optim.lr=1e-5 (repeatable)")
    p.add_argument("--out", type=path_arg, help="the run folder (overrides out_dir)")
    _plugin_option(p)
    resume = p.add_mutually_exclusive_group()
    resume.add_argument("--resume", action="store_true",
                        help="continue the run in the run folder from its newest checkpoint (an error when there is none); "
                             "the config may differ from the run's only in the fields of seeupo.llm.config.RESUMABLE_FIELDS")
    resume.add_argument("--resume-if-possible", action="store_true",
                        help="--resume when the run folder has a checkpoint, else start the run fresh there")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    p.set_defaults(func=_cmd_train)

    p = sub.add_parser("eval", help="avg@k and pass@k of a checkpoint on the evaluation tasks",
                       description="Roll out every evaluation task of the config's environment k times and report "
                                   "avg@k and pass@k per category (seeupo.llm.evaluate).")
    p.add_argument("config", nargs="?", help="YAML run config (its model, env and rollout sections are used)")
    p.add_argument("--checkpoint", help="a run folder (its newest checkpoint) or a checkpoints/step_N folder "
                                        "(default: the config's model as it is)")
    p.add_argument("--k", type=int_range(1, 1000), default=4, help="samples per task (default 4, the paper's avg@4/pass@4)")
    p.add_argument("--max-tasks", type=positive_int, help="only the first N evaluation tasks (default: all)")
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="override a config field (repeatable)")
    p.add_argument("--out", type=path_arg, default="results/eval",
                   help="folder for episodes.jsonl, the settings and the summary (default: results/eval); "
                        "it must be empty unless --resume or --overwrite")
    p.add_argument("--batch", type=int_range(1, 100_000), default=1,
                   help="episodes rolled out together (default 1: each alone, written as it finishes; "
                        "raise it on a GPU to batch generation)")
    p.add_argument("--resume", action="store_true",
                   help="continue the interrupted evaluation in --out: keep its episodes, roll out the rest "
                        "(refused unless config, --k, --checkpoint, --max-tasks and --batch are the same)")
    p.add_argument("--overwrite", action="store_true", help="delete the evaluation files already in --out and start afresh")
    _plugin_option(p)
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    p.set_defaults(func=_cmd_eval)

    p = sub.add_parser("figures", help="regenerate the figures (PNG + JSON data) of the paper's artifacts",
                       description="Compute each figure's data (reading the recorded results in paper_repro/, measuring "
                                   "where a figure needs it) and draw it: OUT/NAME.json and OUT/NAME.png (seeupo.figures).")
    p.add_argument("names", nargs="*", help="figures to make (default: all, in the order of seeupo.figures.FIGURES)")
    p.add_argument("--quick", action="store_true", help="small budgets (the whole set in a few minutes on CPU)")
    p.add_argument("--out", type=path_arg, default="figures", help="output folder (default: figures)")
    p.add_argument("--plot-only", action="store_true", help="redraw the PNGs from the data files in --out")
    p.add_argument("--seed", type=seed_int, default=0, help="seed of the measured figures (default 0)")
    p.add_argument("--runs", nargs="+", metavar="DIR", help="run folders with metrics.jsonl for training_curves "
                                                           "(default: BFCL runs under runs/ and results/)")
    _plugin_option(p)
    p.set_defaults(func=_cmd_figures)

    p = sub.add_parser("presets", help="the algorithm presets and how they differ",
                       description="Print a table of the settings that differ between presets, or every setting "
                                   "of one preset (NAME) or of all (--all).")
    p.add_argument("name", nargs="?", help="print every setting of this preset (built in, or registered by a --plugin)")
    p.add_argument("--all", action="store_true", help="print every setting of every preset")
    p.add_argument("--choices", action="store_true",
                   help="print the allowed values of every choice setting: the registered advantage estimators, "
                        "policy losses and aggregations (with what each needs) and the fixed choices")
    _plugin_option(p)
    p.set_defaults(func=_cmd_presets)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        if hasattr(args, "plugin"):  # installed packages' plugins first, then the command line's
            from seeupo.plugins import entry_point_plugins, load_plugins

            args.plugin = [*entry_point_plugins(), *args.plugin]
            # train and eval load them with the run config (which records them)
            args.plugins_loaded = () if args.command in ("train", "eval") else load_plugins(args.plugin, "--plugin")
        if getattr(args, "no_progress", False):  # Hugging Face's own bars too (transformers reads this on import)
            os.environ["HF_HUB_DISABLE_PROGRESS_BARS"] = "1"
        with no_empty_dirs_left_on_refusal():
            return args.func(args)
    except InputError as err:  # bad files, fields and flags (InstanceError is one); anything else is a bug
        print(f"seeupo {args.command}: error: {err}", file=sys.stderr)
        return 2


def console() -> None:
    """The ``seeupo`` executable: ``main`` with the process-level settings a command line wants."""
    signal.signal(signal.SIGPIPE, signal.SIG_DFL)  # `seeupo ... | head` ends quietly
    sys.exit(main())


if __name__ == "__main__":
    console()
