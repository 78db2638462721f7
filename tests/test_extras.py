"""runtime/extras.py: a feature whose extra is missing is refused naming the extra and the command that installs it,
where a setting asks for it (at start) or a request does; with the extra installed, nothing is said. A missing
package is played by an import hook that refuses it, in this process only."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from bootstrap.settings import parse_settings
from bootstrap.settings_meaning import trace_settings
from bootstrap.settings_schema import SettingsError
from runtime.errors import Status
from runtime.extras import EXTRA_MODULES, MissingExtra, missing_extra
from runtime.openai.chat import render_chat


class _Refusing:
    """A meta path finder for which ``names`` (and the modules under them) are not installed."""

    def __init__(self, names: tuple[str, ...]) -> None:
        self.names = names

    def find_spec(self, name: str, path: object = None, target: object = None) -> None:
        if any(name == refused or name.startswith(refused + ".") for refused in self.names):
            raise ModuleNotFoundError(f"No module named '{name}'")


@pytest.fixture
def without(monkeypatch):
    """Hides packages: refused by the finder, and out of sys.modules until the test ends (then put back)."""
    finders: list[_Refusing] = []

    def refuse(*names: str) -> None:
        finders.append(_Refusing(names))
        sys.meta_path.insert(0, finders[-1])
        for loaded in [name for name in sys.modules if any(name == n or name.startswith(n + ".") for n in names)]:
            monkeypatch.delitem(sys.modules, loaded)

    yield refuse
    for finder in finders:
        sys.meta_path.remove(finder)


def test_the_installed_extras_say_nothing():
    for extra in EXTRA_MODULES:
        assert missing_extra(extra, "a feature") is None


def test_tracing_mode_opentelemetry_without_its_extra_is_refused_at_start(without):
    settings = parse_settings({"server": {"trace_config": ["mode=opentelemetry", "rate=1"]}}, Path("."))
    assert trace_settings(settings).mode == "opentelemetry"
    without("opentelemetry")
    with pytest.raises(SettingsError, match=r"tracing mode 'opentelemetry' needs the 'otel' extra.*"
                                            r"pip install 'serverless-triton\[otel\]'"):
        trace_settings(settings)
    settings = parse_settings({"server": {"trace_config": ["mode=triton", "rate=1"]}}, Path("."))
    assert trace_settings(settings).mode == "triton"  # the other mode needs nothing


def test_a_chat_template_without_its_extra_is_refused_naming_it(without):
    template = "{% for m in messages %}{{ m.content }}{% endfor %}"
    messages = [{"role": "user", "content": "hi"}]
    assert render_chat(template, "llm", messages, None) == "hi"
    without("jinja2")
    with pytest.raises(MissingExtra, match=r"needs the 'openai' extra.*no module 'jinja2'") as refused:
        render_chat(template, "llm", messages, None)
    assert refused.value.status is Status.UNSUPPORTED
