"""Packages only one feature needs, installed as the package's extras (pyproject.toml's ``otel`` and ``openai``):
imported where the feature runs, and named, with the command that installs them, where a setting or a request asks
for a feature whose extra is missing."""

from __future__ import annotations

import importlib.util

from runtime.errors import Unsupported

EXTRA_MODULES = {
    "otel": ("opentelemetry.sdk", "opentelemetry.exporter.otlp.proto.http"),  # tracing mode opentelemetry
    "openai": ("jinja2", "tokenizers"),  # the OpenAI endpoints' chat templates and token counts
}


class MissingExtra(Unsupported):
    """A feature was asked for whose extra is not installed."""


def missing_extra(extra: str, feature: str, modules: tuple[str, ...] = ()) -> str | None:
    """What to tell the user where ``extra`` is not installed (None: it is): all its modules, or those named, are
    looked for (an imported one is found in sys.modules at once; another is looked for on the path)."""
    for module in modules or EXTRA_MODULES[extra]:
        try:
            found = importlib.util.find_spec(module) is not None
        except ImportError:  # its parent package is missing
            found = False
        if not found:
            return (f"{feature} needs the '{extra}' extra, which is not installed (no module '{module}'): "
                    f"pip install 'serverless-triton[{extra}]'")
    return None


def require_extra(extra: str, feature: str, module: str) -> None:
    """MissingExtra naming ``extra`` where ``module``, the part of it ``feature`` needs, is not installed (asked on
    every use: only that module is looked for, 0.1 µs once imported)."""
    assert module in EXTRA_MODULES[extra]
    message = missing_extra(extra, feature, (module,))
    if message is not None:
        raise MissingExtra(message)
