"""From a request's `response_format` / `structured_outputs` to StructuredOutputsParams.

OpenAI's response_format (json_object; json_schema with its schema) and vLLM's structured_outputs
extra (json, regex, choice, grammar, json_object) mean the same thing; a request may use one of
them. A schema, regex or grammar that does not compile is a 400 naming the field and the problem.
"""

from __future__ import annotations

from ladle.entrypoints.openai.errors import BadRequestError
from ladle.entrypoints.openai.protocol import _SamplingFields
from ladle.structured.params import StructuredOutputsParams


def structured_outputs_of(request: _SamplingFields) -> StructuredOutputsParams | None:
    """The request's constraint, or None; raises BadRequestError naming the bad field."""
    response_format = request.response_format
    fields = request.structured_outputs
    wants_format = response_format is not None and response_format.type != "text"
    if wants_format and fields is not None:
        raise BadRequestError(
            "give either response_format or structured_outputs, not both",
            param="structured_outputs",
        )
    if wants_format:
        assert response_format is not None
        if response_format.type == "json_object":
            return _build({"json_object": True}, "response_format")
        if response_format.json_schema is None or response_format.json_schema.schema_ is None:
            raise BadRequestError(
                "response_format of type json_schema needs json_schema.schema",
                param="response_format.json_schema",
            )
        return _build({"json": response_format.json_schema.schema_}, "response_format.json_schema")
    if fields is None:
        return None
    given = {
        "json": fields.json_,
        "regex": fields.regex,
        "choice": fields.choice,
        "grammar": fields.grammar,
        "json_object": fields.json_object or None,
    }
    given = {key: value for key, value in given.items() if value is not None}
    if len(given) != 1:
        raise BadRequestError(
            "structured_outputs must set exactly one of json, regex, choice, grammar, "
            f"json_object; got {', '.join(given) if given else 'none'}",
            param="structured_outputs",
        )
    (key,) = given
    if key == "json" and isinstance(given[key], bool):
        given[key] = {} if given[key] else {"not": {}}
    return _build(given, f"structured_outputs.{key}")


def _build(fields: dict, param: str) -> StructuredOutputsParams:
    try:
        return StructuredOutputsParams(**fields)
    except ValueError as error:
        raise BadRequestError(str(error), param=param) from error
