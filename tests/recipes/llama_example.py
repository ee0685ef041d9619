"""examples/llama.py, loaded once for the recipes beside this file (a recipe file imports a module
beside it, as Python does for a script)."""

import importlib.util
from pathlib import Path

_spec = importlib.util.spec_from_file_location("tests_recipes_llama",
                                               Path(__file__).resolve().parents[2] / "examples" / "llama.py")
llama = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(llama)
