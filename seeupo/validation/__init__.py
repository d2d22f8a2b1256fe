"""One validation layer for everything a user hands to ``seeupo``: files, fields and flags.

Every check raises :class:`~seeupo.validation.errors.InputError`, whose ``str`` is one line naming
the file (when there is one), the field or flag, and the problem. The command line prints it as
``seeupo CMD: error: FILE: field 'X': PROBLEM`` and exits with code 2. Anything else that goes
wrong is a bug of the toolkit and keeps its traceback.

By job, one module each (import from the module; this package imports none of them, so that
:mod:`seeupo.core` depends on :mod:`~seeupo.validation.errors` alone):

* :mod:`~seeupo.validation.errors`: :class:`~seeupo.validation.errors.InputError`, the one exception type.
* :mod:`~seeupo.validation.files`: reading JSON and text files under size, depth and number limits; writing JSON.
* :mod:`~seeupo.validation.schemas`: typed fields, keys and dataclasses read from parsed data.
* :mod:`~seeupo.validation.arguments`: argparse types and output paths (folders made before any work,
  removed again when the command is refused).

None of them imports torch or numpy, so ``seeupo --help`` stays fast.
"""
