"""Every file name of a results folder.

As submitit's ``JobPaths`` owns the files of a job folder, this module owns those of
``results/<name>/``; the modules that write or read them take the names from here
(the sweep saved in it is read and written by :mod:`sweeps.state.saved_sweep`).
Names only: no imports, so anything may import it.
"""

from __future__ import annotations

#: The marker of a sweeps results folder: only folders with it are renamed or written.
MARKER_FILE = ".sweeps-results"
#: The lock a running command holds, and who it is (both 0600).
LOCK_FILE = ".sweeps.lock"
OWNER_FILE = ".sweeps.owner"
#: The seal that lets ``resume`` and ``audit`` load code from the folder (0600).
SEAL_FILE = ".sweeps-seal"
#: The sweep as it ran (base config and space inline), and where it was started from.
SWEEP_FILE = "sweep.yaml"
STATE_FILE = "sweep_state.json"
#: The Optuna study (a JournalStorage file).
STUDY_FILE = "optuna.journal"
#: The per-trial journals, histories and error files.
TRIALS_DIR = "trials"
TRIALS_CSV = "trials.csv"
PARETO_CSV = "pareto.csv"
STABLE_DIR = "stable"
REPORT_HTML = "report.html"
PREFLIGHT_MD = "preflight.md"
#: Why confirmation stopped before ``confirm.keep`` configs held (only then).
SELECTION_NOTES = "selection_notes.txt"
#: Where MLflow has the sweep, or why it was not logged.
TRACKING_NOTE = "tracking.txt"
MLFLOW_DB = "mlflow.db"
#: Trials' shared compile cache (``sweeps run`` only).
INDUCTOR_CACHE = "inductor_cache"
#: Ray Tune's experiment folder of the search, and the name (and prefix: ``confirm-2``,
#: ``confirm-resumed``) of those of the confirmation stages.
RAY_DIR = "ray"
CONFIRM_STAGE = "confirm"
#: ``sweeps stability``'s own folder, and ``sweeps audit``'s outputs.
STABILITY_DIR = "stability"
#: The boundary probe ``sweeps run`` ran for ``search_space.lr.high: probe`` (boundary.md).
PROBE_DIR = "lr_probe"
AUDIT_DIR, AUDIT_CSV, AUDIT_MD = "audit", "audit.csv", "audit.md"
