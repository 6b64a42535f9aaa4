"""What the completion and chat handlers share: the engine client, the served model's name,
and turning engine-side failures into OpenAI errors."""

from __future__ import annotations

import json
import time
from collections.abc import Awaitable, Callable
from typing import TypeVar

from pydantic import BaseModel, ValidationError

from ladle.entrypoints.openai.errors import (
    APIError,
    BadRequestError,
    InternalServerError,
    NotFoundError,
    RateLimitError,
    ServiceUnavailableError,
    from_validation_error,
    from_value_error,
)
from ladle.entrypoints.openai.field_policy import check_request_fields
from ladle.entrypoints.openai.logprobs import TokenTexts
from ladle.entrypoints.openai.protocol import UsageInfo, parse_request
from ladle.entrypoints.openai.request_log import record_engine_request
from ladle.entrypoints.openai.streaming import ClientDisconnected, run_until_disconnect
from ladle.frontend.admission import QueueFullError, QueueLimitError
from ladle.frontend.client import AsyncEngineClient, EngineDeadError, RequestStream
from ladle.outputs import RequestOutput
from ladle.protocol.messages import RequestRejectedError
from ladle.sampling.params import SamplingParams

RequestModel = TypeVar("RequestModel", bound=BaseModel)
ResultT = TypeVar("ResultT")


class OpenAIServing:
    """Base of the endpoint handlers; holds state explicitly, no globals."""

    def __init__(
        self,
        client: AsyncEngineClient,
        served_model_name: str,
        allow_unknown_fields: bool = False,
        return_tokens_as_token_ids: bool = False,
    ) -> None:
        """return_tokens_as_token_ids: vLLM's server flag, logprobs name every token
        `token_id:N` (a request may ask for it too)."""
        self.client = client
        self.served_model_name = served_model_name
        self.other_model_names: frozenset[str] = frozenset()  # also accepted (server.py)
        self.allow_unknown_fields = allow_unknown_fields
        self.token_texts = TokenTexts(client.tokenizer)
        self._token_id_names = TokenTexts(client.tokenizer, as_token_ids=True)
        self.return_tokens_as_token_ids = return_tokens_as_token_ids

    def logprob_names(self, request) -> TokenTexts:
        """How the request's logprobs name tokens: by text, or `token_id:N` when the server
        flag or the request's return_tokens_as_token_ids asks (prompt_logprobs'
        decoded_token stays the text)."""
        if self.return_tokens_as_token_ids or request.return_tokens_as_token_ids:
            return self._token_id_names
        return self.token_texts

    def parse_checked(self, request_class: type[RequestModel], body: bytes) -> RequestModel:
        """Parse a request body and check what every route checks first: a known model and a
        living engine. Invalid bodies become 400s naming the field."""
        try:
            request = parse_request(request_class, body)
        except ValidationError as error:
            raise from_validation_error(error) from error
        # Parsed again as plain JSON to see the fields the model does not hold (it drops them).
        check_request_fields(json.loads(body), request_class, self.allow_unknown_fields)
        self.check_model(request.model)
        self.check_engine()
        return request

    async def collect(
        self, raw_request, collector: Awaitable[ResultT], close: Callable[[], None]
    ) -> ResultT:
        """Await a non-streaming result. A client that leaves aborts it (ClientDisconnected);
        any other failure becomes an OpenAI error; the request streams are closed either way."""
        try:
            return await run_until_disconnect(raw_request, collector)
        except (ClientDisconnected, APIError):
            raise
        except Exception as error:
            raise self.generation_error(error) from error
        finally:
            close()

    def check_model(self, model: str | None) -> None:
        if (
            model is not None
            and model != self.served_model_name
            and model not in self.other_model_names
        ):
            raise NotFoundError(
                f"The model `{model}` does not exist; this server serves "
                f"`{self.served_model_name}`",
                param="model",
                code="model_not_found",
            )

    def check_engine(self) -> None:
        if self.client.dead_reason is not None:
            raise ServiceUnavailableError(self.client.dead_reason, code="engine_unavailable")

    def admit_batch(self, num_sequences: int, num_prompt_tokens: int) -> None:
        """All-or-nothing admission for a request that becomes several engine requests."""
        try:
            self.client.admission.check(num_sequences, num_prompt_tokens)
        except QueueFullError as error:
            raise self.queue_full(error) from error
        except QueueLimitError as error:
            raise BadRequestError(str(error), code="queue_limit_exceeded") from error

    def queue_full(self, error: QueueFullError) -> RateLimitError:
        return RateLimitError(
            str(error),
            code="rate_limit_exceeded",
            headers={"Retry-After": str(error.retry_after_seconds)},
        )

    def add_request(
        self, prefix: str, prompt: str | None, prompt_token_ids: list[int], params: SamplingParams,
        priority: int, admission_checked: bool = False, stream: bool = False,
        kv_transfer_params: dict | None = None,
    ) -> RequestStream:
        """admission_checked: admit_batch() already admitted the batch this request is part of
        (so a batch is admitted whole or not at all). stream: the response streams deltas."""
        try:
            request_stream = self.client.add_request(
                self.client.new_request_id(prefix), prompt, prompt_token_ids, params, priority,
                admission_checked=admission_checked, stream=stream,
                kv_transfer_params=kv_transfer_params,
            )
        except QueueFullError as error:
            raise self.queue_full(error) from error
        except QueueLimitError as error:
            raise BadRequestError(str(error), code="queue_limit_exceeded") from error
        except EngineDeadError as error:
            raise ServiceUnavailableError(str(error), code="engine_unavailable") from error
        except ValueError as error:  # the request itself (a field needing the tokenizer, ...)
            raise from_value_error(error) from error
        record_engine_request(len(prompt_token_ids), request_stream)
        return request_stream

    @staticmethod
    def generation_error(error: Exception) -> APIError:
        """The API error for an exception raised while a request ran in the engine."""
        if isinstance(error, APIError):
            return error
        if isinstance(error, RequestRejectedError):
            return BadRequestError(str(error))
        if isinstance(error, EngineDeadError):
            return InternalServerError(
                f"the request failed: {error}", code="engine_dead"
            )
        return InternalServerError(f"the request failed: {type(error).__name__}: {error}")

    @staticmethod
    def usage(prompt_lengths: list[int], outputs: list[RequestOutput]) -> UsageInfo:
        prompt_tokens = sum(prompt_lengths)
        completion_tokens = sum(len(c.token_ids) for o in outputs for c in o.outputs)
        return UsageInfo(
            prompt_tokens=prompt_tokens,
            completion_tokens=completion_tokens,
            total_tokens=prompt_tokens + completion_tokens,
        )

    @staticmethod
    def created() -> int:
        return int(time.time())
