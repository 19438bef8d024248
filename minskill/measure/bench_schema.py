"""`python -m minskill.measure.bench server --workload schema`: what constrained decoding costs per
token under a large schema, against free decoding, with the schema's compile time reported apart.

ORDER_SCHEMA is the JSON schema pydantic v2 writes for a 30-field nested model (an order: its
customer and addresses, line items, a discriminated payment, a dict of tags, optional notes;
tests/test_schema_pydantic.py checks that it is what pydantic writes, keyword for keyword). The
model (--model, --dtype, --quantize) is loaded in this process and driven through its engine
(serve.backends.ModelBackend, continuous batching), with no HTTP in between:

    compile ms        compile_schema(ORDER_SCHEMA) the first time, then again (cached per schema
                      text: the second is a dictionary look-up)
    vocabulary ms     the tokenizer's tokens in a trie (serve.constrained.Vocabulary), once per
                      tokenizer
    ms per token      greedy, one request, its wall less that of the same request cut to one
                      token, over the tokens after the first: free text (a long story: as many
                      tokens); the schema with its masks not yet cached (first); the same request
                      again (masks cached per state); then the same with 8 requests decoded
                      together (ms per decoding step of the 8 rows)

and the schema's over free per token (the issue aims at 1.2 or less after the first token).
"""
from __future__ import annotations

import json
import time

import torch

from minskill.serve.backends import ModelBackend
from minskill.serve.request_parsing import parse_chat_request
from minskill.serve.constrained import vocabulary_for
from minskill.serve.json_schema import compile_schema

ORDER_TEXT = r'''
{"$defs":{"Address":{"properties":{"street":{"maxLength":60,"title":"Street",
"type":"string"},"city":{"title":"City","type":"string"},"postcode":{"pattern":"^\\d{5}$",
"title":"Postcode","type":"string"},"country":{"enum":["FR","DE","US","GB"],
"title":"Country","type":"string"}},"required":["street","city","postcode","country"],
"title":"Address","type":"object"},"Card":{"properties":{"kind":{"const":"card",
"title":"Kind","type":"string"},"last4":{"pattern":"^\\d{4}$","title":"Last4",
"type":"string"}},"required":["kind","last4"],"title":"Card","type":"object"},
"Customer":{"properties":{"id":{"format":"uuid","title":"Id","type":"string"},
"name":{"maxLength":40,"minLength":1,"title":"Name","type":"string"},
"email":{"format":"email","title":"Email","type":"string"},"since":{"format":"date",
"title":"Since","type":"string"},"address":{"$ref":"#/$defs/Address"}},"required":["id",
"name","email","since","address"],"title":"Customer","type":"object"},
"LineItem":{"properties":{"sku":{"pattern":"^[A-Z]{3}-\\d{4}$","title":"Sku",
"type":"string"},"quantity":{"exclusiveMinimum":0,"maximum":100,"title":"Quantity",
"type":"integer"},"unit_price":{"minimum":0,"title":"Unit Price","type":"number"},
"discount":{"anyOf":[{"exclusiveMaximum":1,"minimum":0,"type":"number"},{"type":"null"}],
"default":null,"title":"Discount"}},"required":["sku","quantity","unit_price"],
"title":"LineItem","type":"object"},"Transfer":{"properties":{"kind":{"const":"transfer",
"title":"Kind","type":"string"},"iban":{"pattern":"^[A-Z]{2}\\d{2}[A-Z0-9]{10,30}$",
"title":"Iban","type":"string"}},"required":["kind","iban"],"title":"Transfer",
"type":"object"}},"properties":{"order_id":{"title":"Order Id","type":"integer"},
"created":{"format":"date-time","title":"Created","type":"string"},
"status":{"enum":["new","paid","shipped"],"title":"Status","type":"string"},
"priority":{"maximum":5,"minimum":1,"title":"Priority","type":"integer"},
"customer":{"$ref":"#/$defs/Customer"},"items":{"items":{"$ref":"#/$defs/LineItem"},
"maxItems":5,"minItems":1,"title":"Items","type":"array"},
"payment":{"discriminator":{"mapping":{"card":"#/$defs/Card",
"transfer":"#/$defs/Transfer"},"propertyName":"kind"},"oneOf":[{"$ref":"#/$defs/Card"},
{"$ref":"#/$defs/Transfer"}],"title":"Payment"},"shipping":{"$ref":"#/$defs/Address"},
"tags":{"additionalProperties":{"type":"string"},"maxProperties":3,"title":"Tags",
"type":"object"},"gift":{"default":false,"title":"Gift","type":"boolean"},
"coupon":{"anyOf":[{"type":"string"},{"type":"null"}],"default":null,"title":"Coupon"},
"note":{"anyOf":[{"maxLength":100,"type":"string"},{"type":"null"}],"default":null,
"title":"Note"},"total":{"minimum":0,"title":"Total","type":"number"}},
"required":["order_id","created","status","priority","customer","items","payment",
"shipping","total"],"title":"Order","type":"object"}
'''
ORDER_SCHEMA = json.loads("".join(ORDER_TEXT.splitlines()))    # (a line may end inside a string)
PROMPT = [{"role": "user", "content": "Write an example order of three items, as JSON."}]
STORY = [{"role": "user", "content": "Write a long story about a ship."}]   # (free: a long reply)


def bench_schema(args) -> dict:
    """Load --model, measure (module docstring), print the table; the numbers, by row."""
    started = time.perf_counter()
    compile_schema(ORDER_SCHEMA)
    compiled = time.perf_counter()
    compile_schema(ORDER_SCHEMA)
    again = time.perf_counter()
    dtype = None if args.dtype == "auto" else getattr(torch, args.dtype)
    backend = ModelBackend.from_spec(args.model, dtype=dtype, quantize=args.quantize,
                                     scheduler="continuous")
    read = time.perf_counter()
    vocabulary_for(backend.tokenizer, backend.vocab_size)
    vocabulary = time.perf_counter() - read
    max_tokens = args.max_tokens or 512
    fields = {"response_format": {"type": "json_schema", "json_schema": {
        "name": "order", "schema": ORDER_SCHEMA, "strict": True}}}
    rows = {"free": per_token(backend, STORY, {}, max_tokens),
            "schema, first": per_token(backend, PROMPT, fields, max_tokens),
            "schema, again": per_token(backend, PROMPT, fields, max_tokens),
            "free, 8 rows": per_token(backend, STORY, {}, max_tokens, rows=8),
            "schema, 8 rows": per_token(backend, PROMPT, fields, max_tokens, rows=8)}
    numbers = {"compile ms": 1000 * (compiled - started), "vocabulary ms": 1000 * vocabulary,
               "compile again ms": 1000 * (again - compiled), **rows}
    print(f"\nschema: a 30-field nested pydantic model, model {args.model}, {args.dtype}, "
          f"quantize {args.quantize}, greedy, --max-tokens {max_tokens}")
    print(f"compile {numbers['compile ms']:.1f} ms (again: {numbers['compile again ms']:.3f} ms); "
          f"vocabulary {numbers['vocabulary ms']:.0f} ms (once per tokenizer)")
    print(f"{'decoding':16s} {'tokens':>7s} {'ms per token':>13s} {'over free':>10s}  finish")
    for name, (tokens, ms, finish) in rows.items():
        free = rows["free, 8 rows" if "8 rows" in name else "free"][1]
        print(f"{name:16s} {tokens:7d} {ms:13.2f} {ms / free:10.2f}  {finish}")
    return numbers


def per_token(backend, messages: list, fields: dict, max_tokens: int,
              rows: int = 1) -> tuple[int, float, str]:
    """(tokens, ms per decoding step after the first, finish reason) of `rows` identical greedy
    requests decoded together (the same reply each: a greedy row's tokens do not depend on its
    batch)."""
    def run(limit):
        requests = [parse_chat_request(
            {"messages": messages, "max_tokens": limit, "temperature": 0, **fields}, backend
        ) for _ in range(rows)]
        began = time.perf_counter()
        [[choice], *_] = backend.complete(requests)
        return time.perf_counter() - began, choice
    first, _ = run(1)
    wall, choice = run(max_tokens)
    tokens = choice.completion_tokens
    return tokens, 1000 * (wall - first) / max(tokens - 1, 1), choice.finish_reason
