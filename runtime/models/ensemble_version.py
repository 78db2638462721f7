"""A loaded version of an ensemble: no instances of its own, ready while every model its steps call is, its
requests run by the ensemble's scheduler (``runtime/scheduling/ensemble.py``)."""

from __future__ import annotations

from runtime.errors import ModelLoadError
from runtime.handler import ServerServices
from runtime.models.model import ModelState, ModelVersion
from runtime.scheduling.ensemble import EnsembleScheduler, version_text


class EnsembleVersion(ModelVersion):
    """A loaded version of an ensemble: no instances; ready while every model its steps call is."""

    services: ServerServices | None = None

    def load(self, contexts: list) -> None:
        """Only its label files to read (its composing models were checked before)."""
        try:
            self.load_labels()
        except ModelLoadError as exc:
            self.state, self.reason = ModelState.UNAVAILABLE, str(exc)

    @property
    def loaded(self) -> bool:
        return self.state is not ModelState.UNAVAILABLE

    @property
    def ready(self) -> bool:
        return self.state is ModelState.READY and not self._unready_composing()

    def _unready_composing(self) -> list[str]:
        services = self.services
        if services is None:
            return ["(no server)"]
        return [step.model_name for step in self.spec.steps
                if not services.model_ready(step.model_name, version_text(step))]

    def status(self) -> tuple[str, str]:
        if self.state is ModelState.READY and (unready := self._unready_composing()):
            return ModelState.UNAVAILABLE.value, f"composing model(s) not ready: {', '.join(unready)}"
        return self.state.value, self.reason

    @property
    def device(self) -> str:
        return "-"

    def start(self) -> None:
        assert self.services is not None  # handed over by the manager before the version starts
        self.scheduler = EnsembleScheduler(self.spec, self.services, self.stats)  # type: ignore[assignment]
        self.state, self.reason = ModelState.READY, ""
