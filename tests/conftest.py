"""Fixtures shared by the test files."""
import pytest


@pytest.fixture
def no_compile(monkeypatch):
    """Make any compile fail loudly: a test using it proves its refusals come before the DSL is reached."""
    import gemmlab.compile

    def refuse(*args, **kwargs):
        raise AssertionError("compiled before the arguments were checked")

    monkeypatch.setattr(gemmlab.compile, "compile_for", refuse)
