"""Registers qbackend's Hugging Face quantization method (qbackend.hf) with transformers without
making `import qbackend` import transformers (2-4 s): at once when transformers' modeling_utils (the
module whose from_pretrained reads the quantizer registry) is already loaded, otherwise right after it
loads, through a finder on sys.meta_path that wraps that one module's loader. So `from_pretrained(folder saved with QBackendConfig)` works after a plain
`import qbackend`, whichever of the two was imported first."""
from __future__ import annotations

import importlib
import importlib.abc
import sys
import warnings

__all__ = ["install"]

# The module whose from_pretrained consults the quantizer registry. Registering once it has executed
# (not when the registry module itself has: transformers.quantizers is then still half-initialized).
REGISTRY = "transformers.modeling_utils"
INTEGRATION = "qbackend.hf"


def _register() -> None:
    # A deferred import by design: qbackend.hf imports transformers, which qbackend does not need.
    # A transformers this integration cannot use must not break transformers' own import: a warning.
    try:
        importlib.import_module(INTEGRATION)
    except Exception as exc:  # noqa: BLE001
        warnings.warn(f"qbackend could not register its quantization method with transformers: {exc!r}",
                      RuntimeWarning, stacklevel=2)


class _RegisteringLoader(importlib.abc.Loader):
    """The registry module's own loader, registering qbackend once the module has executed."""

    def __init__(self, loader):
        self._loader = loader

    def create_module(self, spec):
        return self._loader.create_module(spec)

    def exec_module(self, module):
        self._loader.exec_module(module)
        _uninstall()
        _register()

    def __getattr__(self, name):
        return getattr(self._loader, name)


class _RegistryFinder(importlib.abc.MetaPathFinder):
    """Finds nothing itself; when the registry module is imported, takes the spec the other finders
    give and makes its loader register qbackend after executing the module."""

    def find_spec(self, fullname, path, target=None):
        if fullname != REGISTRY:
            return None
        for finder in sys.meta_path:
            if finder is self or not hasattr(finder, "find_spec"):
                continue
            spec = finder.find_spec(fullname, path, target)
            if spec is not None:
                break
        else:
            return None
        if spec.loader is not None and hasattr(spec.loader, "exec_module"):
            spec.loader = _RegisteringLoader(spec.loader)
        return spec


_FINDER = _RegistryFinder()


def _uninstall() -> None:
    if _FINDER in sys.meta_path:
        sys.meta_path.remove(_FINDER)


def install() -> None:
    """Register now if transformers' modeling_utils is loaded, else when it loads. Never fails
    the import of qbackend: without transformers nothing happens."""
    if REGISTRY in sys.modules:
        _register()
    elif _FINDER not in sys.meta_path:
        sys.meta_path.insert(0, _FINDER)
