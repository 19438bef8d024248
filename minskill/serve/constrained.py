"""Constrained decoding: at each step, only the tokens that keep a reply valid JSON for its schema.

A request's `response_format` (`json_object`, or `json_schema` with a schema), or vLLM's
`guided_json` / `structured_outputs: {"json": ...}`, is read by response_schema(payload) into a
JsonFormat: the schema compiled by minskill.serve.json_schema into a byte-level state machine. Each
of the request's samples then gets a JsonConstraint, and before every decoding step the engine
(minskill.serve.scheduler) calls constrain(logits, rows): each constrained row's logits are -inf
wherever its schema forbids the token, so greedy decoding takes the likeliest allowed token and
sampling draws among the allowed ones (log-probs are those of this constrained distribution). A
row's mask depends on its own tokens only: the batch never changes a reply.

Which tokens? Vocabulary holds every token's bytes in a trie (a tree of byte prefixes). From the
row's state, the trie is walked depth first: a branch dies at the first byte the machine refuses, so
a step visits only the prefixes that stay valid, not all V tokens, and a token is allowed when the
walk reaches its end alive. Inside a string without pattern or format, or an object's other key
(most of a reply's tokens), nearly every token is allowed: there the walk would visit the whole
trie, so tokens of two or more plain string bytes (no quote, backslash, control character or partial
UTF-8 character) are counted once, when the vocabulary is read, and allowed with a vector comparison
against the characters maxLength leaves (their close_cost less what minLength still asks); only the
other tokens are walked. Masks are cached per state (a state repeats along a string without
maxLength, and across requests with one schema).

Closing within max_tokens. The walk also records, per allowed token, close_cost: the fewest bytes
that complete the JSON after it. A byte-level BPE has a token for every byte, so that many more
tokens always suffice, and a token is allowed only while its cost and the stop token still fit in
the row's max_new_tokens. The reply therefore ends with a complete value and a stop token ("stop"),
unless max_tokens is too small for the shortest valid reply: then any valid prefix is allowed and
the reply is cut ("length"). Once the value is complete only the stop tokens are allowed; special
tokens never are.
"""
from __future__ import annotations

import json
from collections import OrderedDict
from dataclasses import dataclass
from functools import lru_cache

import torch
from tokenizers.decoders import ByteLevel as ByteLevelDecoder

from minskill.serve.errors import bad_request
from minskill.serve.json_machine import (JSON_OBJECT, InKey, InString, SchemaNode, advance,
                                         close_cost, is_complete, start_state)
from minskill.serve.json_schema import SchemaError, compile_schema

FORMAT_FIELDS = ("response_format", "guided_json", "structured_outputs")
NOT_ALLOWED = 2**31 - 1       # a token's cost where the schema forbids it
CACHED_STATES = 256           # masks kept per vocabulary (one (V,) int32 tensor each)
CACHED_STEPS = 200_000        # (state, byte) -> state kept per vocabulary


@dataclass(frozen=True)
class JsonFormat:
    """The JSON a request asks for: `field` names where it asked (for messages), `node` is its
    schema."""
    field: str
    node: SchemaNode


# ---- the request fields --------------------------------------------------------------------------
def response_schema(payload: dict) -> JsonFormat | None:
    """The JsonFormat a request body asks for (None: free text), or a 400 naming the field at
    fault."""
    asked = [key for key in FORMAT_FIELDS if payload.get(key) not in (None, {"type": "text"})]
    if len(asked) > 1:
        raise bad_request(f"'{asked[0]}' and '{asked[1]}' both ask for a reply format: give one",
                          asked[1])
    if not asked:
        return None
    key, value = asked[0], payload[asked[0]]
    if key == "guided_json":
        return _compiled(_schema_value(value, key), key)
    if key == "structured_outputs":
        return _structured_outputs(value)
    if not isinstance(value, dict) or value.get("type") not in ("json_object", "json_schema"):
        raise bad_request(f"'response_format' must be {{\"type\": \"text\" | \"json_object\" | "
                          f"\"json_schema\", ...}}, got {json.dumps(value)[:100]}",
                          "response_format")
    _only(value, ("type", "json_schema"), "response_format")
    if value["type"] == "json_object":
        return JsonFormat("response_format", JSON_OBJECT)
    spec = value.get("json_schema")
    where = "response_format.json_schema"
    if not isinstance(spec, dict) or "schema" not in spec:
        raise bad_request(f"'{where}' must be an object with a 'schema' (and 'name', 'strict')",
                          where)
    _only(spec, ("name", "schema", "strict", "description"), where)
    if spec.get("strict") not in (None, True, False):
        raise bad_request(f"'{where}.strict' must be true or false", f"{where}.strict")
    return _compiled(spec["schema"], f"{where}.schema", "response_format")


def _structured_outputs(value) -> JsonFormat:
    """vLLM's structured_outputs: {"json": schema} or {"json_object": true}; other kinds are
    refused."""
    if not isinstance(value, dict):
        raise bad_request("'structured_outputs' must be an object such as {\"json\": {...schema}}",
                          "structured_outputs")
    served = {k: v for k, v in value.items() if v not in (None, False)}
    _only(served, ("json", "json_object"), "structured_outputs")
    if len(served) != 1:
        raise bad_request("'structured_outputs' must hold one of 'json' (a schema) or "
                          "'json_object': true", "structured_outputs")
    if "json_object" in served:
        return JsonFormat("structured_outputs", JSON_OBJECT)
    where = "structured_outputs.json"
    return _compiled(_schema_value(served["json"], where), where, "structured_outputs")


def _only(value: dict, keys: tuple, where: str):
    for key in value:
        if key not in keys:
            raise bad_request(f"'{where}.{key}' is not implemented by this server (it reads "
                              f"{', '.join(keys)})", f"{where}.{key}", "unsupported_field")


def _schema_value(value, where: str):
    """A schema sent as an object or, as vLLM also takes it, as JSON text."""
    if isinstance(value, str):
        try:
            return json.loads(value)
        except json.JSONDecodeError as error:
            raise bad_request(f"'{where}' is not valid JSON: {error}", where)
    return value


def _compiled(schema, where: str, field: str | None = None) -> JsonFormat:
    try:
        return JsonFormat(field or where, compile_schema(schema))
    except SchemaError as error:
        raise bad_request(f"'{where}' at {error}", where, "unsupported_schema")
    except RecursionError:
        raise bad_request(f"'{where}' is nested too deeply", where, "unsupported_schema")


# ---- one row: its state, and the tokens it allows ------------------------------------------------
class JsonConstraint:
    """One sample's constraint: the machine's state after the sample's tokens so far."""

    def __init__(self, node: SchemaNode, vocabulary: "Vocabulary"):
        self.vocabulary, self.state, self.read = vocabulary, start_state(node), 0

    def allowed(self, tokens: list[int], tokens_left: int) -> torch.Tensor:
        """(V,) bool: the tokens that may come after `tokens` with `tokens_left` tokens to go
        (module doc)."""
        vocabulary = self.vocabulary
        for token in tokens[self.read:]:
            for byte in vocabulary.token_bytes[token] or b"":
                self.state = vocabulary.advance(self.state, byte)
        self.read = len(tokens)
        cost = vocabulary.costs(self.state)
        allowed = cost <= tokens_left - 2   # the token, `cost` single-byte tokens, the stop token
        if not bool(allowed.any()):
            allowed = cost < NOT_ALLOWED    # too few tokens left to close: the reply will be cut
        if not bool(allowed.any()):         # no token continues the JSON (a vocabulary without
            allowed[vocabulary.stop_ids] = True     # some byte): the reply ends here
        return allowed


def constrain(logits: torch.Tensor, rows) -> torch.Tensor:
    """`logits` (rows, V) with -inf where a row's constraint forbids the token (rows without one: as
    they are); the engine's rows have .constraint, .tokens and .max_new_tokens."""
    constrained = [i for i, row in enumerate(rows) if getattr(row, "constraint", None) is not None]
    if not constrained:
        return logits
    masks = torch.stack([rows[i].constraint.allowed(rows[i].tokens,
                                                    rows[i].max_new_tokens - len(rows[i].tokens))
                         for i in constrained])
    index = torch.tensor(constrained, device=logits.device)
    logits = logits.clone()
    forbidden = ~masks[:, :logits.shape[1]].to(logits.device)
    logits[index] = logits[index].masked_fill(forbidden, float("-inf"))
    return logits


# ---- the vocabulary: every token's bytes, in a trie ----------------------------------------------
class _Trie:
    __slots__ = ("children", "ids")

    def __init__(self):
        self.children: dict[int, _Trie] = {}
        self.ids: list[int] = []        # the tokens whose bytes end here


@lru_cache(maxsize=4)
def vocabulary_for(tokenizer, width: int) -> "Vocabulary":
    """The Vocabulary of `tokenizer` for logits `width` wide, read once per tokenizer."""
    return Vocabulary(tokenizer, width)


class Vocabulary:
    """Each token's bytes (None for special and added tokens), the trie of them, and per token the
    characters it adds inside a string when it is plain string text (else -1)."""

    def __init__(self, tokenizer, width: int):
        self.width = width
        self.token_bytes = token_bytes(tokenizer, width)
        self.stop_ids = sorted(t for t in tokenizer.stop_token_ids if t < width)
        plain = [_plain_chars(b) for b in self.token_bytes]
        self.plain_chars = torch.tensor(plain, dtype=torch.int32)
        self.trie = _trie((t, b) for t, b in enumerate(self.token_bytes) if b)
        self.unplain_trie = _trie((t, b) for t, b in enumerate(self.token_bytes)
                                  if b and plain[t] < 0)
        self._costs: OrderedDict = OrderedDict()
        self._steps: dict = {}

    def advance(self, state: frozenset, byte: int) -> frozenset:
        """json_machine.advance, remembered (a walk meets the same state and byte again and
        again)."""
        key = (state, byte)
        after = self._steps.get(key)
        if after is None:
            if len(self._steps) >= CACHED_STEPS:
                self._steps.clear()
            after = self._steps[key] = advance(state, byte)
        return after

    def costs(self, state: frozenset) -> torch.Tensor:
        """(V,) int32: per token, close_cost after it from `state`; -1 for a stop token once the
        value is complete; NOT_ALLOWED for a token the schema forbids."""
        if state in self._costs:
            self._costs.move_to_end(state)
            return self._costs[state]
        cost = torch.full((self.width,), NOT_ALLOWED, dtype=torch.int32)
        trie, string = self.trie, _open_string(state)
        if string is not None:                       # plain string text: counted, not walked
            plain, base = self.plain_chars >= 0, close_cost(state)
            if isinstance(string, InKey):            # (a longer key: a byte more to close, at most
                cost[plain] = base + 2               # one more for the other keys still needed)
            else:
                most, least = string.node.max_chars, string.node.min_chars
                room = NOT_ALLOWED - 1 if most is None else most - string.chars
                plain &= self.plain_chars <= room
                need = max(least - string.chars, 0)  # characters minLength still asks for
                cost[plain] = (base - self.plain_chars.clamp(max=need))[plain]
            trie = self.unplain_trie
        ids, values = self._walk(trie, state)
        if ids:
            cost[torch.tensor(ids)] = torch.tensor(values, dtype=torch.int32)
        if is_complete(state):
            cost[self.stop_ids] = -1
        self._costs[state] = cost
        if len(self._costs) > CACHED_STATES:
            self._costs.popitem(last=False)
        return cost

    def _walk(self, trie: _Trie, state: frozenset) -> tuple[list[int], list[int]]:
        """The tokens of `trie` that `state` reads whole, and close_cost after each."""
        ids, values, todo = [], [], [(trie, state)]
        while todo:
            node, state = todo.pop()
            for byte, child in node.children.items():
                after = self.advance(state, byte)
                if not after:
                    continue
                if child.ids:
                    ids += child.ids
                    values += [close_cost(after)] * len(child.ids)
                if child.children:
                    todo.append((child, after))
        return ids, values


def _open_string(state: frozenset) -> InString | InKey | None:
    """The string (or key) the reply is in, when that is all `state` allows and no character is
    half written."""
    if len(state) != 1:
        return None
    [stack] = state
    top = stack[-1] if stack else None
    return top if isinstance(top, (InString, InKey)) and not top.rest else None


def _trie(tokens) -> _Trie:
    root = _Trie()
    for token, data in tokens:
        node = root
        for byte in data:
            node = node.children.setdefault(byte, _Trie())
        node.ids.append(token)
    return root


def _plain_chars(data: bytes | None) -> int:
    """The characters `data` adds inside a JSON string when it is two bytes or more of whole UTF-8
    characters none of which is a quote, a backslash or a control character (what InString reads
    without a second look), else -1."""
    try:
        text = (data or b"").decode("utf-8")
    except UnicodeDecodeError:
        return -1
    if len(data or b"") < 2 or any(c in '"\\' or c < " " for c in text):
        return -1                   # (a single byte is walked: its close_cost is exact there)
    return len(text)


def token_bytes(tokenizer, width: int) -> list[bytes | None]:
    """Each token id's bytes below `width` (the logits' width): byte-level BPE's vocabulary entries
    mapped back to bytes; None for added and special tokens and ids the tokenizer lacks. A tokenizer
    that is not byte-level gets each token's decoded text (right for most; a SentencePiece word
    start loses its space)."""
    backend = tokenizer.backend
    added = backend.get_added_tokens_decoder()
    byte_level = isinstance(backend.decoder, ByteLevelDecoder)
    out = []
    for token in range(width):
        piece = None if token in added else backend.id_to_token(token)
        if piece is None:
            out.append(None)
        elif byte_level:
            out.append(bytes(BYTE_OF_CHAR[c] for c in piece))
        else:
            out.append(tokenizer.decode([token]).encode())
    return out


def _byte_of_char() -> dict[str, int]:
    """GPT-2's byte-level alphabet, inverted: the vocabulary's character for each byte -> the
    byte."""
    kept = [*range(ord("!"), ord("~") + 1), *range(ord("\xa1"), ord("\xac") + 1),
            *range(ord("\xae"), 256)]
    moved = [b for b in range(256) if b not in kept]
    return {**{chr(b): b for b in kept}, **{chr(256 + i): b for i, b in enumerate(moved)}}


BYTE_OF_CHAR = _byte_of_char()
