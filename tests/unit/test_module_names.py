"""No module of the project shadows a standard-library module: a script run from its folder
(``spark-submit bridge/pipeline/report.py``) puts that folder first on ``sys.path``."""

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_no_module_is_named_as_a_standard_library_module() -> None:
    clashes = [str(path.relative_to(ROOT))
               for package in ("bridge", "adapters", "policies")
               for path in (ROOT / package).rglob("*")
               if (path.suffix == ".py" or (path.is_dir() and (path / "__init__.py").exists()))
               and path.stem in sys.stdlib_module_names]
    assert clashes == []
