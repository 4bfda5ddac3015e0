# Version-gap shim for running rdma-core's tests/ (from a newer PyPI pyverbs sdist) on
# Debian's pyverbs 44.
#
# The tests import names that pyverbs 44 does not have (classes, enum members, whole
# modules such as pyverbs.librdmacm_enums). One such import in a shared helper (utils.py
# imports mlx5_base, which imports pyverbs.device.FdArr) would stop every test file from
# loading. So a missing name imported from a pyverbs module resolves to a stand-in that
# raises VersionGap when a test actually uses it; a test ending in VersionGap is counted
# as "version-gap" by run.py, never as a pass or a skip. Names pyverbs 44 has are
# untouched: the stand-in exists only where the import would otherwise fail.
import importlib.abc
import importlib.machinery
import sys
import types


# Modules the newer tests import that pyverbs 44 does not have. Only these become stand-ins:
# a Cython module's `import collections` first tries `pyverbs.collections`, which must
# still fail.
MISSING_MODULES = {'pyverbs.librdmacm_enums', 'pyverbs.providers.mlx5.mlx5dv_dmabuf'}


class VersionGap(Exception):
    """A test used a pyverbs API that Debian's pyverbs 44 does not have."""


class _MissingMeta(type):
    def __getattr__(cls, attr):
        if attr.startswith('__'):
            raise AttributeError(attr)
        return missing(f'{cls._gap_name}.{attr}')

    def __call__(cls, *args, **kwargs):
        raise VersionGap(f'pyverbs 44 lacks {cls._gap_name}')

    def _gap(cls, *args, **kwargs):
        raise VersionGap(f'pyverbs 44 lacks {cls._gap_name}')

    __or__ = __ror__ = __and__ = __rand__ = __add__ = __radd__ = _gap
    __int__ = __index__ = __lt__ = __gt__ = __le__ = __ge__ = _gap

    def __eq__(cls, other):
        return cls is other

    __hash__ = type.__hash__


def missing(name):
    """A stand-in class for the missing pyverbs name `name` (subclassable, so a test
    module's `class X(MissingBase)` still loads)."""
    return _MissingMeta(name.rsplit('.', 1)[-1], (), {'_gap_name': name})


def _patch(module):
    if getattr(module, '_rdmx_gap_patched', False) or '__getattr__' in module.__dict__:
        return
    name = module.__name__

    def __getattr__(attr):
        if attr.startswith('__'):
            raise AttributeError(attr)
        return missing(f'{name}.{attr}')

    module.__getattr__ = __getattr__
    module._rdmx_gap_patched = True


class _Finder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Patches every pyverbs module on import; makes absent pyverbs modules stand-ins."""

    def find_spec(self, fullname, path, target=None):
        if not fullname.startswith('pyverbs.'):
            return None
        for finder in sys.meta_path:
            if finder is self:
                continue
            spec = finder.find_spec(fullname, path, target) if hasattr(finder, 'find_spec') else None
            if spec is not None:
                loader = spec.loader
                if loader is None:  # a namespace package: nothing to patch
                    return spec
                orig_exec = loader.exec_module

                def exec_module(module, _orig=orig_exec):
                    _orig(module)
                    _patch(module)

                loader.exec_module = exec_module
                return spec
        if fullname in MISSING_MODULES:
            return importlib.machinery.ModuleSpec(fullname, self, is_package=True)
        return None

    def create_module(self, spec):
        module = types.ModuleType(spec.name)
        module.__path__ = []
        return module

    def exec_module(self, module):
        _patch(module)


def install():
    import pyverbs  # the package itself exists in 44
    _patch(pyverbs)
    sys.meta_path.insert(0, _Finder())
