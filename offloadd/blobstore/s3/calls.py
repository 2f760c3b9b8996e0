"""One S3 operation: retries, deadline, store-health gating and endpoint choice (:class:`Requests`).

Retries
  Only what can succeed later is retried (:func:`~offloadd.blobstore.s3.errors.translate` says
  ``Retriable``), waiting as the product's one backoff policy says (:class:`offloadd.retry.Backoff`
  from ``retry_base_s`` to ``retry_max_s``: capped exponential, full jitter), at most
  ``max_attempts`` times while the store is healthy.

Deadlines
  Every operation has one overall deadline: ``request_timeout_s``, plus ``nbytes /
  min_transfer_rate_bytes_per_s`` for the bytes it moves. It covers everything the operation
  waits for — a connection from the pool, an endpoint that never answers ``Expect:
  100-continue`` (botocore sends it on ``PutObject`` and ``UploadPart``, and no socket timeout
  runs while the body waits for it), sending, the answer, every retry and backoff, and waiting
  for a paused circuit. An operation that misses it fails as ``Retriable`` naming the
  operation, the key and the deadline, is logged at WARNING, and counts as an unanswered
  failure for the store's health. The prober's ``HeadBucket`` has the plain
  ``request_timeout_s`` deadline.

Store health
  Every primary-endpoint outcome is recorded in the :class:`~offloadd.blobstore.health.StoreHealth`
  with every request's start and end and whether a failure was an answer or silence. While it
  is PAUSED, write operations wait for it instead of sending requests. Failures seen while the
  circuit is not HEALTHY do not use up ``max_attempts``; the policy's ``pause_timeout_s`` (and
  the deadline) bound the operation instead. Refusals (see
  :func:`~offloadd.blobstore.s3.errors.is_refusal`) are reported as such and end the operation
  at once.

Replicated reads
  ``read_endpoints`` serve reads: the local zone first, then the fewest pending requests; an
  endpoint that fails in any way (including not having the object yet) is skipped at once for
  the rest of that operation, and the primary endpoint, retried as usual, is the last resort.
  Only the primary's outcomes feed the store-health circuit.
"""

from __future__ import annotations

import asyncio
import enum
import logging
import random
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

from botocore.exceptions import ClientError

from offloadd.blobstore.health import HealthState, StoreHealth
from offloadd.blobstore.requests import RequestCounts
from offloadd.blobstore.s3.errors import BACKEND_ERRORS, is_refusal, translate
from offloadd.blobstore.s3.options import S3Options
from offloadd.blobstore.s3.plan import GiveUp, RetryPlan
from offloadd.blobstore.s3.session import ANSWERED, Endpoint
from offloadd.errors import Fatal, NotFound, OffloaddError, Retriable
from offloadd.retry import Backoff

log = logging.getLogger(__name__)

T = TypeVar("T")

LIST_PAGE_SIZE = 1000  # S3's own maximum per list call


@dataclass
class _Done(Generic[T]):
    value: T


@dataclass
class _Said:
    """What an operation's give-up messages name."""

    op: str
    where: str
    budget: float
    last: OffloaddError | None = None

    def missed(self, why: str, level: int = logging.WARNING) -> Retriable:
        last = f"; last error: {self.last}" if self.last is not None else ""
        said = (f"S3 {self.op} {self.where}: {why} (deadline {self.budget:.1f}s: [blobstore] "
                f"request_timeout_s){last}")
        log.log(level, "%s", said)
        return Retriable(said)


class State(enum.Enum):
    OPEN = "open"
    CLOSED = "closed"


class Requests:
    """Makes the operations of one store; the store's keys are ``options.prefix + key``."""

    def __init__(self, options: S3Options, primary: Endpoint, replicas: tuple[Endpoint, ...],
                 health: StoreHealth, counts: RequestCounts | None = None) -> None:
        self.options = options
        # the clients count what they send (session.count_requests); this counts the requests
        # our deadline cut short, which no client event reports
        self.counts = counts or RequestCounts("aws-s3")
        self.primary = primary
        self.health = health
        self.state = State.OPEN
        self._readers = (*replicas, primary) if replicas else ()
        self._backoff = Backoff(options.retry_base_s, options.retry_max_s)
        self._rng = random.Random()

    def key(self, key: str) -> str:
        return self.options.prefix + key

    async def head_once(self, key: str) -> Mapping[str, Any] | None:
        """One HeadObject of ``key`` on the primary, never retried, None if it fails: the
        check a retried write makes for its own earlier try, inside that write's retry loop
        (which waits while the circuit is open; a HEAD retried on its own would not)."""
        try:
            resp: Mapping[str, Any] = await self.primary.client.head_object(
                Bucket=self.options.bucket, Key=self.key(key))
        except BACKEND_ERRORS:
            return None
        return resp

    def where(self, key: str | None) -> str:
        bucket = self.options.bucket
        return f"s3://{bucket}/{self.key(key)}" if key is not None else f"s3://{bucket}"

    def sse(self) -> dict[str, str]:
        if self.options.sse is None:
            return {}
        args: dict[str, str] = {"ServerSideEncryption": self.options.sse}
        if self.options.sse_kms_key_id:
            args["SSEKMSKeyId"] = self.options.sse_kms_key_id
        return args

    def pick(self, read: bool, skip: set[int]) -> Endpoint:
        if not read or not self._readers:
            return self.primary
        # The primary is never skipped, so there is always a candidate.
        candidates = [ep for ep in self._readers if id(ep) not in skip]
        local = self.options.local_zone

        def rank(ep: Endpoint) -> tuple[bool, bool, int]:
            return (not (local and ep.zone == local), ep.primary, ep.pending)

        return min(candidates, key=rank)

    async def run(
        self,
        op: str,
        key: str | None,
        fn: Callable[[Any], Awaitable[T]],
        *,
        write: bool = False,
        read: bool = False,
        already_done: Callable[[], Awaitable[T | None]] | None = None,
        nbytes: int = 0,
    ) -> T:
        """One S3 operation with retries, store-health gating, endpoint choice and one overall
        deadline (``S3Options.deadline_s(nbytes)``; see the module docstring). The retry rules
        are :class:`~offloadd.blobstore.s3.plan.RetryPlan`'s; this executes them.

        ``write``: wait while the store's circuit is open. ``read``: may use a read endpoint.
        ``already_done``: before each retry, may answer for an attempt whose reply was lost.
        ``nbytes``: what the operation moves, for its deadline.
        """
        if self.state is not State.OPEN:
            raise Fatal(f"S3 {op} {self.where(key)}: the store is closed")
        loop = asyncio.get_running_loop()
        budget = self.options.deadline_s(nbytes)
        plan = RetryPlan(loop.time() + budget, self.options.max_attempts,
                         self.health.policy.pause_timeout_s, self._backoff, self._rng)
        said = _Said(op, self.where(key), budget)
        skip: set[int] = set()
        tries = 0
        while True:
            if write and self.health.state is HealthState.PAUSED:
                await self._wait_while_paused(plan, said)
            if tries and already_done is not None:
                try:
                    async with asyncio.timeout_at(plan.deadline):
                        done = await already_done()
                except TimeoutError:
                    raise said.missed("no answer before the deadline") from None
                if done is not None:
                    return done
            ep = self.pick(read, skip)
            tries += 1
            outcome = await self._try(ep, fn, plan.deadline, said)
            if isinstance(outcome, _Done):
                return outcome.value
            err = outcome
            if not ep.primary:
                # A replica that fails, or has not seen the object yet: another server may
                # answer, so fail over at once; the primary, never skipped, has the last word.
                log.debug("read endpoint %s failed over: %s", ep.url, err)
                skip.add(id(ep))
                continue
            if not isinstance(err, Retriable):
                raise err
            said.last = err
            degraded = write and self.health.state is not HealthState.HEALTHY
            verdict = plan.after_failure(loop.time(), degraded=degraded)
            if verdict is GiveUp.DEGRADED:
                raise Retriable(f"{err} (store degraded for "
                                f"{self.health.policy.pause_timeout_s:.0f}s)") from err
            if verdict is GiveUp.ATTEMPTS:
                raise Retriable(f"{err} (gave up after {plan.attempts} attempts)") from err
            if verdict is GiveUp.DEADLINE:
                raise said.missed("still failing, and another try would pass the deadline") \
                    from err
            log.debug("retrying %s %s in %.2fs: %s", op, self.where(key), verdict, err)
            await asyncio.sleep(verdict)

    async def _wait_while_paused(self, plan: RetryPlan, said: _Said) -> None:
        loop = asyncio.get_running_loop()
        try:
            await self.health.wait_until_healthy(plan.pause_limit(loop.time()))
        except Retriable:
            if loop.time() >= plan.deadline - 1e-3:
                # the circuit's own WARNING said why already: no line per operation
                raise said.missed("the store's circuit was still open at the deadline",
                                  logging.DEBUG) from None
            raise

    async def _try(self, ep: Endpoint, fn: Callable[[Any], Awaitable[T]], deadline: float,
                   said: _Said) -> _Done[T] | OffloaddError:
        """One request to ``ep``, its outcome recorded in the store's health when ``ep`` is the
        primary: the answer, or the error to decide on. Raises what ends the operation at once
        (the primary's silence past the deadline, a refusal)."""
        loop = asyncio.get_running_loop()
        ep.pending += 1
        ticket = self.health.request_started() if ep.primary else 0
        err: OffloaddError
        # A replica may use at most half of what is left: the primary needs time too.
        until = deadline if ep.primary else loop.time() + (deadline - loop.time()) / 2
        timer = asyncio.timeout_at(until)
        answered = False
        seen = [0]
        reset = ANSWERED.set(seen)
        try:
            async with timer:
                result = await fn(ep.client)
        except TimeoutError as exc:
            if timer.expired() and not seen[0]:
                self.counts.count(said.op, "timeout")  # cut short: no client event said so
            if not timer.expired():  # a socket timeout of botocore's, not our deadline
                err = translate(exc, said.op, said.where)
                err.__cause__ = exc
            elif ep.primary:
                self.health.record_stall()  # silence: the worst kind of failure
                raise said.missed("no answer before the deadline") from None
            else:
                err = Retriable(f"S3 {said.op} {said.where}: read endpoint {ep.url} did "
                                "not answer in time")
        except OffloaddError as exc:
            err = exc
        except BACKEND_ERRORS as exc:
            err = translate(exc, said.op, said.where)
            err.__cause__ = exc
            answered = isinstance(exc, ClientError)
            if ep.primary and not isinstance(err, Retriable | NotFound) and is_refusal(exc):
                self.health.record_refused(said.op, str(err))
                raise err from None
        else:
            if ep.primary:
                self.health.record_success(said.op)
            return _Done(result)
        finally:
            ANSWERED.reset(reset)
            ep.pending -= 1
            if ticket:
                self.health.request_finished(ticket)
        if ep.primary:
            # Any non-transient answer proves the store is up and answering.
            if isinstance(err, Retriable):
                self.health.record_failure(answered=answered)
            else:
                self.health.record_success()
        return err

    async def pages(self, op: str, prefix: str, size_arg: str,
                    call: Callable[[Any, dict[str, Any]], Awaitable[dict[str, Any]]],
                    markers: Mapping[str, str]) -> AsyncIterator[dict[str, Any]]:
        """Every page of a listing of the keys under ``prefix``: one call per page, so that each
        page is retried alone (not botocore's paginator), and continuation markers stay on the
        primary endpoint. ``markers``: request argument -> the answer's field it continues from.
        """
        args: dict[str, Any] = {"Bucket": self.options.bucket, "Prefix": self.key(prefix),
                                size_arg: LIST_PAGE_SIZE}
        while True:
            page = await self.run(op, prefix, lambda c: call(c, args))
            yield page
            if not page.get("IsTruncated"):
                return
            for arg, field in markers.items():
                args[arg] = page.get(field) or ""
            if not any(args[arg] for arg in markers):
                raise Fatal(f"S3 {op} {self.where(prefix)}: a truncated page without "
                            "continuation markers; the store's answers are broken")

    async def probe(self) -> None:
        seen = [0]
        reset = ANSWERED.set(seen)
        try:
            async with asyncio.timeout(self.options.request_timeout_s):
                await self.primary.client.head_bucket(Bucket=self.options.bucket)
        except TimeoutError as exc:
            if not seen[0]:
                self.counts.count("HeadBucket", "timeout")
            raise Retriable(f"S3 HeadBucket {self.where(None)}: no answer within "
                            f"{self.options.request_timeout_s:.1f}s") from exc
        except BACKEND_ERRORS as exc:
            err = translate(exc, "HeadBucket", self.where(None))
            if isinstance(err, Retriable):
                raise err from None
            # 403 (no s3:ListBucket) or 404 still prove the store is answering.
        finally:
            ANSWERED.reset(reset)
