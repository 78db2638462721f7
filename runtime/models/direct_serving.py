"""Which model versions a front end may serve plain requests of past the core (``runtime/direct_path.py``).

A version qualifies where the core would do nothing to its plain requests but validate them, queue them and hand
them to the model's worker as they are: a Python-backend model in one worker process of its own (with more
instances the core runs requests side by side, which a lane, one request at a time, would not), without sequence
batching, a decoupled policy, the response cache, reshaping, BYTES inputs or a rate limiter, and one that sends no
BLS requests (an execution the core does not see could not be told apart in its wait graph). It is the version a
request naming none goes to.
"""

from __future__ import annotations

from runtime.direct_path import DirectModel
from runtime.errors import ServingError
from runtime.models.manager import ModelManager
from runtime.models.model import ModelVersion
from runtime.scheduling.scheduler import Scheduler


def direct_models(manager: ModelManager) -> list[DirectModel]:
    """The versions that qualify now, each with its instance's side door."""
    chosen = []
    for name in list(manager.models):
        try:
            model = manager.get(name)
        except ServingError:
            continue
        scheduler = model.scheduler
        if not _qualifies(model) or type(scheduler) is not Scheduler:
            continue
        channel = model.instances[0].direct_channel()
        if channel is None or channel.closed:
            continue
        chosen.append(DirectModel(model.spec, model.version, channel, scheduler.idle.watch, model.stats.add_source,
                                  model.stats.record_served))
    return chosen


def _qualifies(model: ModelVersion) -> bool:
    spec = model.spec
    return (model.ready and len(model.instances) == 1 and model.rate_limiter is None and not spec.decoupled
            and spec.sequence is None and not spec.response_cache and not spec.reshapes_inputs
            and not spec.reshaped_outputs and all(t.datatype != "BYTES" for t in spec.inputs))
