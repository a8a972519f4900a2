"""The public namespace is exactly what __all__ says."""

import lazyenc


def test_all_exports_exist_and_are_sorted() -> None:
    """Every name in __all__ exists, and the list is sorted."""
    assert sorted(lazyenc.__all__) == lazyenc.__all__
    for name in lazyenc.__all__:
        assert hasattr(lazyenc, name), name


def test_public_members_are_all_exported() -> None:
    """Every public attribute of the package is listed in __all__ (submodules aside)."""
    public = {n for n in dir(lazyenc) if not n.startswith("_")}
    submodules = {"testing", "admin", "server"}
    assert set(lazyenc.__all__) - {"__version__"} == public - submodules


def test_every_error_derives_from_the_root() -> None:
    """One root exception: every lazyenc error is a LazyEncError."""
    errors = [getattr(lazyenc, n) for n in lazyenc.__all__ if n.endswith("Error")]
    assert errors
    for cls in errors:
        assert issubclass(cls, lazyenc.LazyEncError), cls
