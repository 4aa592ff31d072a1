"""One file per target family, each exporting one `Family` (`models/family.py`); `models/registry.py`
lists them. A family file holds the Hugging Face names it owns, its config resolver, its checkpoint's
tensor names and quirks, its layer constructor and its capabilities."""
