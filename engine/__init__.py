"""A simulated inference engine with batching, and the frontend-engine hop (see the README's
architecture section).

The engine model (pure Python, no I/O) is what the hop's engine process runs and what the
batching measurements simulate::

    from inferwire.engine import EngineConfig, EngineCore, EngineRequest, VirtualClock

    core = EngineCore(EngineConfig(policy="continuous"), VirtualClock())
    core.add(EngineRequest("r0", chunks, prompt_tokens=512, arrival_s=0.0))
    while core.has_work():
        result = core.step()      # one prefill or decode iteration; None: nothing to do now

- :mod:`~inferwire.engine.steps`: :class:`StepModel`, iteration times (defaults fitted to
  NVIDIA's TensorRT-LLM figures for LLaMA 7B on an H100, FP8; cited there);
- :mod:`~inferwire.engine.kvcache`: paged KV blocks;
- :mod:`~inferwire.engine.scheduler`: :class:`EngineConfig`, the policies (:data:`POLICIES`)
  and C13's :func:`adaptive_batch` with its load estimate;
- :mod:`~inferwire.engine.model`: the values in and out (:class:`EngineRequest`,
  :class:`Output`, :class:`StepResult`, :class:`RequestRecord`); errors in
  :mod:`~inferwire.engine.errors`, root :class:`EngineError`;
- :mod:`~inferwire.engine.core`: :class:`EngineCore`, one iteration per :meth:`~EngineCore.step`;
- :mod:`~inferwire.engine.simulate`: :func:`simulate` a trace on a :class:`VirtualClock`,
  :func:`poisson_trace`.

Beyond the shared contract of issue 17: :class:`EngineRequest`'s ``arrival_s`` may be ``None``
(stamped at ``add``); :meth:`StepModel.prefill_batch_s`; :class:`StepResult` also has ``kind``
("prefill" or "decode"), ``rids`` (the requests computed), ``kv_blocks_used`` and ``end_s``;
:class:`RequestRecord` also has ``output_chunks``, ``prompt_tokens`` and the split ``queue_s`` (a
field: all time spent waiting), ``prefill_s``, ``decode_s``, ``stall_s``;
:meth:`EngineCore.next_wakeup_s` (the static policy's fill timeout: when to call ``step`` again
with nothing new), :meth:`EngineCore.pop_record`; :class:`EngineConfig` fields
``admit_batch``, ``max_prefill_tokens``, ``adaptive_target_step_s``, ``adaptive_ewma_alpha``,
``keep_records`` (and ``max_batch`` defaults to 256, vLLM's ``max_num_seqs``, not 64);
:class:`SimResult` ``rejected``, ``output_tokens``, ``percentiles``; ``poisson_trace(cv=...)``
for gamma arrivals; the errors :class:`InvalidRequestError`, :class:`RequestTooLargeError`,
:class:`DuplicateRequestError` under :class:`EngineError`.
"""

from .clock import Clock, RealClock, VirtualClock
from .core import EngineCore
from .errors import (
    DuplicateRequestError,
    EngineError,
    EngineFullError,
    InvalidRequestError,
    RequestTooLargeError,
)
from .kvcache import KVCache
from .model import EngineRequest, Output, RequestRecord, StepResult
from .scheduler import (
    POLICIES,
    EngineConfig,
    LoadEstimator,
    PolicyName,
    adaptive_batch,
)
from .simulate import SimResult, poisson_trace, simulate
from .steps import StepModel

__all__ = [
    "POLICIES",
    "Clock",
    "DuplicateRequestError",
    "EngineConfig",
    "EngineCore",
    "EngineError",
    "EngineFullError",
    "EngineRequest",
    "InvalidRequestError",
    "KVCache",
    "LoadEstimator",
    "Output",
    "PolicyName",
    "RealClock",
    "RequestRecord",
    "RequestTooLargeError",
    "SimResult",
    "StepModel",
    "StepResult",
    "VirtualClock",
    "adaptive_batch",
    "poisson_trace",
    "simulate",
]
