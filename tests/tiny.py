"""Tiny checkpoints for tests: a byte-level BPE tokenizer and random-weight HF model folders, built in seconds.

Import from a test as `from tiny import make_tiny_model_dir, make_tiny_tokenizer_dir, TEMPLATES`
(pytest.ini puts tests/ on the import path).

make_tiny_tokenizer_dir(path, chat_format="chatml")
    Trains a byte-level BPE (vocabulary 400 + special tokens) on a small built-in corpus with
    `tokenizers`' BpeTrainer and writes tokenizer.json + tokenizer_config.json holding the real chat
    template of a model family, so HF's PreTrainedTokenizerFast can render it as the reference.
    chat_format names the template (see TEMPLATES):
        "chatml"   SmolLM2-135M-Instruct (ChatML, default system prompt)
        "qwen2.5"  Qwen2.5-Instruct (ChatML, default system prompt)
        "qwen3"    Qwen3 (ChatML, <think> handling, enable_thinking), plus <think> </think> (added, not special)
        "llama3"   Llama 3.2-Instruct (Cutting Knowledge Date, strftime_now date)
        "llama3.1" Llama 3.1-Instruct (fixed date "26 Jul 2024" unless given)
        "llama3.0" Meta-Llama-3-Instruct (no system turn added)
    ChatML specials: <|endoftext|> <|im_start|> <|im_end|>.
    Llama specials: <|begin_of_text|> <|end_of_text|> <|start_header_id|> <|end_header_id|> <|eot_id|>.
    Special tokens take ids 0..k-1 (SmolLM2's layout: for "chatml", <|im_start|> = 1, <|im_end|> = 2).

make_tiny_model_dir(path, family="llama", tied=True, chat_format=None, seed=0, shards=1, init_std=0.05,
                    **config_overrides)
    Writes config.json, model.safetensors (or `shards` files + model.safetensors.index.json), the tokenizer
    files above and generation_config.json. Weights are random (torch.Generator seeded with `seed`), written
    directly in Hugging Face names with torch + safetensors, so they do not depend on minskill.nn.model:
        llama  hidden 64, 2 layers, 4 heads, 2 kv heads (head_dim 16), MLP 128; config overrides may add
               e.g. rope_scaling={"rope_type": "llama3", ...}
        qwen2  the same shape plus q/k/v biases
        qwen3  explicit head_dim 32 (!= hidden/heads) and q_norm/k_norm
    tied=False adds lm_head.weight and sets tie_word_embeddings false. Norm weights are 1 + noise and
    biases are nonzero, so a loader that skips them is caught. chat_format defaults to the family's own
    ("llama3", "qwen2.5", "qwen3"). Returns the folder as a Path.
"""
from __future__ import annotations

import json
from pathlib import Path

import torch
from safetensors.torch import save_file
from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers, trainers

# ---- the real chat templates (as shipped in each model's tokenizer_config.json) --------------------------------

SMOLLM2_TEMPLATE = (
    "{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}{{ '<|im_start|>system\n"
    "You are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\n' }}{% endif %}"
    "{{'<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n'}}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}")

QWEN25_TEMPLATE = r"""{%- if tools %}
    {{- '<|im_start|>system\n' }}
    {%- if messages[0]['role'] == 'system' %}
        {{- messages[0]['content'] }}
    {%- else %}
        {{- 'You are Qwen, created by Alibaba Cloud. You are a helpful assistant.' }}
    {%- endif %}
    {{- "\n\n# Tools\n\nYou may call one or more functions to assist with the user query.\n\nYou are provided with function signatures within <tools></tools> XML tags:\n<tools>" }}
    {%- for tool in tools %}
        {{- "\n" }}
        {{- tool | tojson }}
    {%- endfor %}
    {{- "\n</tools>\n\nFor each function call, return a json object with function name and arguments within <tool_call></tool_call> XML tags:\n<tool_call>\n{\"name\": <function-name>, \"arguments\": <args-json-object>}\n</tool_call><|im_end|>\n" }}
{%- else %}
    {%- if messages[0]['role'] == 'system' %}
        {{- '<|im_start|>system\n' + messages[0]['content'] + '<|im_end|>\n' }}
    {%- else %}
        {{- '<|im_start|>system\nYou are Qwen, created by Alibaba Cloud. You are a helpful assistant.<|im_end|>\n' }}
    {%- endif %}
{%- endif %}
{%- for message in messages %}
    {%- if (message.role == "user") or (message.role == "system" and not loop.first) or (message.role == "assistant" and not message.tool_calls) %}
        {{- '<|im_start|>' + message.role + '\n' + message.content + '<|im_end|>' + '\n' }}
    {%- elif message.role == "assistant" %}
        {{- '<|im_start|>' + message.role }}
        {%- if message.content %}
            {{- '\n' + message.content }}
        {%- endif %}
        {%- for tool_call in message.tool_calls %}
            {%- if tool_call.function is defined %}
                {%- set tool_call = tool_call.function %}
            {%- endif %}
            {{- '\n<tool_call>\n{"name": "' }}
            {{- tool_call.name }}
            {{- '", "arguments": ' }}
            {{- tool_call.arguments | tojson }}
            {{- '}\n</tool_call>' }}
        {%- endfor %}
        {{- '<|im_end|>\n' }}
    {%- elif message.role == "tool" %}
        {%- if (loop.index0 == 0) or (messages[loop.index0 - 1].role != "tool") %}
            {{- '<|im_start|>user' }}
        {%- endif %}
        {{- '\n<tool_response>\n' }}
        {{- message.content }}
        {{- '\n</tool_response>' }}
        {%- if loop.last or (messages[loop.index0 + 1].role != "tool") %}
            {{- '<|im_end|>\n' }}
        {%- endif %}
    {%- endif %}
{%- endfor %}
{%- if add_generation_prompt %}
    {{- '<|im_start|>assistant\n' }}
{%- endif %}
"""

QWEN3_TEMPLATE = r"""{%- if tools %}
    {{- '<|im_start|>system\n' }}
    {%- if messages[0].role == 'system' %}
        {{- messages[0].content + '\n\n' }}
    {%- endif %}
    {{- "# Tools\n\nYou may call one or more functions to assist with the user query.\n\nYou are provided with function signatures within <tools></tools> XML tags:\n<tools>" }}
    {%- for tool in tools %}
        {{- "\n" }}
        {{- tool | tojson }}
    {%- endfor %}
    {{- "\n</tools>\n\nFor each function call, return a json object with function name and arguments within <tool_call></tool_call> XML tags:\n<tool_call>\n{\"name\": <function-name>, \"arguments\": <args-json-object>}\n</tool_call><|im_end|>\n" }}
{%- else %}
    {%- if messages[0].role == 'system' %}
        {{- '<|im_start|>system\n' + messages[0].content + '<|im_end|>\n' }}
    {%- endif %}
{%- endif %}
{%- set ns = namespace(multi_step_tool=true, last_query_index=messages|length - 1) %}
{%- for message in messages[::-1] %}
    {%- set index = (messages|length - 1) - loop.index0 %}
    {%- if ns.multi_step_tool and message.role == "user" and message.content is string and not(message.content.startswith('<tool_response>') and message.content.endswith('</tool_response>')) %}
        {%- set ns.multi_step_tool = false %}
        {%- set ns.last_query_index = index %}
    {%- endif %}
{%- endfor %}
{%- for message in messages %}
    {%- if message.content is string %}
        {%- set content = message.content %}
    {%- else %}
        {%- set content = '' %}
    {%- endif %}
    {%- if (message.role == "user") or (message.role == "system" and not loop.first) %}
        {{- '<|im_start|>' + message.role + '\n' + content + '<|im_end|>' + '\n' }}
    {%- elif message.role == "assistant" %}
        {%- set reasoning_content = '' %}
        {%- if message.reasoning_content is string %}
            {%- set reasoning_content = message.reasoning_content %}
        {%- else %}
            {%- if '</think>' in content %}
                {%- set reasoning_content = content.split('</think>')[0].rstrip('\n').split('<think>')[-1].lstrip('\n') %}
                {%- set content = content.split('</think>')[-1].lstrip('\n') %}
            {%- endif %}
        {%- endif %}
        {%- if loop.index0 > ns.last_query_index %}
            {%- if loop.last or (not loop.last and reasoning_content) %}
                {{- '<|im_start|>' + message.role + '\n<think>\n' + reasoning_content.strip('\n') + '\n</think>\n\n' + content.lstrip('\n') }}
            {%- else %}
                {{- '<|im_start|>' + message.role + '\n' + content }}
            {%- endif %}
        {%- else %}
            {{- '<|im_start|>' + message.role + '\n' + content }}
        {%- endif %}
        {%- if message.tool_calls %}
            {%- for tool_call in message.tool_calls %}
                {%- if (loop.first and content) or (not loop.first) %}
                    {{- '\n' }}
                {%- endif %}
                {%- if tool_call.function %}
                    {%- set tool_call = tool_call.function %}
                {%- endif %}
                {{- '<tool_call>\n{"name": "' }}
                {{- tool_call.name }}
                {{- '", "arguments": ' }}
                {%- if tool_call.arguments is string %}
                    {{- tool_call.arguments }}
                {%- else %}
                    {{- tool_call.arguments | tojson }}
                {%- endif %}
                {{- '}\n</tool_call>' }}
            {%- endfor %}
        {%- endif %}
        {{- '<|im_end|>\n' }}
    {%- elif message.role == "tool" %}
        {%- if loop.first or (messages[loop.index0 - 1].role != "tool") %}
            {{- '<|im_start|>user' }}
        {%- endif %}
        {{- '\n<tool_response>\n' }}
        {{- content }}
        {{- '\n</tool_response>' }}
        {%- if loop.last or (messages[loop.index0 + 1].role != "tool") %}
            {{- '<|im_end|>\n' }}
        {%- endif %}
    {%- endif %}
{%- endfor %}
{%- if add_generation_prompt %}
    {{- '<|im_start|>assistant\n' }}
    {%- if enable_thinking is defined and enable_thinking is false %}
        {{- '<think>\n\n</think>\n\n' }}
    {%- endif %}
{%- endif %}"""

LLAMA32_TEMPLATE = r"""{{- bos_token }}
{%- if custom_tools is defined %}
    {%- set tools = custom_tools %}
{%- endif %}
{%- if not tools_in_user_message is defined %}
    {%- set tools_in_user_message = true %}
{%- endif %}
{%- if not date_string is defined %}
    {%- if strftime_now is defined %}
        {%- set date_string = strftime_now("%d %b %Y") %}
    {%- else %}
        {%- set date_string = "26 Jul 2024" %}
    {%- endif %}
{%- endif %}
{%- if not tools is defined %}
    {%- set tools = none %}
{%- endif %}

{#- This block extracts the system message, so we can slot it into the right place. #}
{%- if messages[0]['role'] == 'system' %}
    {%- set system_message = messages[0]['content']|trim %}
    {%- set messages = messages[1:] %}
{%- else %}
    {%- set system_message = "" %}
{%- endif %}

{#- System message #}
{{- "<|start_header_id|>system<|end_header_id|>\n\n" }}
{%- if tools is not none %}
    {{- "Environment: ipython\n" }}
{%- endif %}
{{- "Cutting Knowledge Date: December 2023\n" }}
{{- "Today Date: " + date_string + "\n\n" }}
{%- if tools is not none and not tools_in_user_message %}
    {{- "You have access to the following functions. To call a function, please respond with JSON for a function call." }}
    {{- 'Respond in the format {"name": function name, "parameters": dictionary of argument name and its value}.' }}
    {{- "Do not use variables.\n\n" }}
    {%- for t in tools %}
        {{- t | tojson(indent=4) }}
        {{- "\n\n" }}
    {%- endfor %}
{%- endif %}
{{- system_message }}
{{- "<|eot_id|>" }}

{#- Custom tools are passed in a user message with some extra guidance #}
{%- if tools_in_user_message and not tools is none %}
    {#- Extract the first user message so we can plug it in here #}
    {%- if messages | length != 0 %}
        {%- set first_user_message = messages[0]['content']|trim %}
        {%- set messages = messages[1:] %}
    {%- else %}
        {{- raise_exception("Cannot put tools in the first user message when there's no first user message!") }}
{%- endif %}
    {{- '<|start_header_id|>user<|end_header_id|>\n\n' -}}
    {{- "Given the following functions, please respond with a JSON for a function call " }}
    {{- "with its proper arguments that best answers the given prompt.\n\n" }}
    {{- 'Respond in the format {"name": function name, "parameters": dictionary of argument name and its value}.' }}
    {{- "Do not use variables.\n\n" }}
    {%- for t in tools %}
        {{- t | tojson(indent=4) }}
        {{- "\n\n" }}
    {%- endfor %}
    {{- first_user_message + "<|eot_id|>"}}
{%- endif %}

{%- for message in messages %}
    {%- if not (message.role == 'ipython' or message.role == 'tool' or 'tool_calls' in message) %}
        {{- '<|start_header_id|>' + message['role'] + '<|end_header_id|>\n\n'+ message['content'] | trim + '<|eot_id|>' }}
    {%- elif 'tool_calls' in message %}
        {%- if not message.tool_calls|length == 1 %}
            {{- raise_exception("This model only supports single tool-calls at once!") }}
        {%- endif %}
        {%- set tool_call = message.tool_calls[0].function %}
        {{- '<|start_header_id|>assistant<|end_header_id|>\n\n' -}}
        {{- '{"name": "' + tool_call.name + '", ' }}
        {{- '"parameters": ' }}
        {{- tool_call.arguments | tojson }}
        {{- "}" }}
        {{- "<|eot_id|>" }}
    {%- elif message.role == "tool" or message.role == "ipython" %}
        {{- "<|start_header_id|>ipython<|end_header_id|>\n\n" }}
        {%- if message.content is mapping or message.content is iterable %}
            {{- message.content | tojson }}
        {%- else %}
            {{- message.content }}
        {%- endif %}
        {{- "<|eot_id|>" }}
    {%- endif %}
{%- endfor %}
{%- if add_generation_prompt %}
    {{- '<|start_header_id|>assistant<|end_header_id|>\n\n' }}
{%- endif %}
"""

LLAMA31_TEMPLATE = r"""{{- bos_token }}
{%- if custom_tools is defined %}
    {%- set tools = custom_tools %}
{%- endif %}
{%- if not tools_in_user_message is defined %}
    {%- set tools_in_user_message = true %}
{%- endif %}
{%- if not date_string is defined %}
    {%- set date_string = "26 Jul 2024" %}
{%- endif %}
{%- if not tools is defined %}
    {%- set tools = none %}
{%- endif %}

{#- This block extracts the system message, so we can slot it into the right place. #}
{%- if messages[0]['role'] == 'system' %}
    {%- set system_message = messages[0]['content']|trim %}
    {%- set messages = messages[1:] %}
{%- else %}
    {%- set system_message = "" %}
{%- endif %}

{#- System message + builtin tools #}
{{- "<|start_header_id|>system<|end_header_id|>\n\n" }}
{%- if builtin_tools is defined or tools is not none %}
    {{- "Environment: ipython\n" }}
{%- endif %}
{%- if builtin_tools is defined %}
    {{- "Tools: " + builtin_tools | reject('equalto', 'code_interpreter') | join(", ") + "\n\n"}}
{%- endif %}
{{- "Cutting Knowledge Date: December 2023\n" }}
{{- "Today Date: " + date_string + "\n\n" }}
{%- if tools is not none and not tools_in_user_message %}
    {{- "You have access to the following functions. To call a function, please respond with JSON for a function call." }}
    {{- 'Respond in the format {"name": function name, "parameters": dictionary of argument name and its value}.' }}
    {{- "Do not use variables.\n\n" }}
    {%- for t in tools %}
        {{- t | tojson(indent=4) }}
        {{- "\n\n" }}
    {%- endfor %}
{%- endif %}
{{- system_message }}
{{- "<|eot_id|>" }}

{#- Custom tools are passed in a user message with some extra guidance #}
{%- if tools_in_user_message and not tools is none %}
    {#- Extract the first user message so we can plug it in here #}
    {%- if messages | length != 0 %}
        {%- set first_user_message = messages[0]['content']|trim %}
        {%- set messages = messages[1:] %}
    {%- else %}
        {{- raise_exception("Cannot put tools in the first user message when there's no first user message!") }}
{%- endif %}
    {{- '<|start_header_id|>user<|end_header_id|>\n\n' -}}
    {{- "Given the following functions, please respond with a JSON for a function call " }}
    {{- "with its proper arguments that best answers the given prompt.\n\n" }}
    {{- 'Respond in the format {"name": function name, "parameters": dictionary of argument name and its value}.' }}
    {{- "Do not use variables.\n\n" }}
    {%- for t in tools %}
        {{- t | tojson(indent=4) }}
        {{- "\n\n" }}
    {%- endfor %}
    {{- first_user_message + "<|eot_id|>"}}
{%- endif %}

{%- for message in messages %}
    {%- if not (message.role == 'ipython' or message.role == 'tool' or 'tool_calls' in message) %}
        {{- '<|start_header_id|>' + message['role'] + '<|end_header_id|>\n\n'+ message['content'] | trim + '<|eot_id|>' }}
    {%- elif 'tool_calls' in message %}
        {%- if not message.tool_calls|length == 1 %}
            {{- raise_exception("This model only supports single tool-calls at once!") }}
        {%- endif %}
        {%- set tool_call = message.tool_calls[0].function %}
        {%- if builtin_tools is defined and tool_call.name in builtin_tools %}
            {{- '<|start_header_id|>assistant<|end_header_id|>\n\n' -}}
            {{- "<|python_tag|>" + tool_call.name + ".call(" }}
            {%- for arg_name, arg_val in tool_call.arguments | items %}
                {{- arg_name + '="' + arg_val + '"' }}
                {%- if not loop.last %}
                    {{- ", " }}
                {%- endif %}
                {%- endfor %}
            {{- ")" }}
        {%- else  %}
            {{- '<|start_header_id|>assistant<|end_header_id|>\n\n' -}}
            {{- '{"name": "' + tool_call.name + '", ' }}
            {{- '"parameters": ' }}
            {{- tool_call.arguments | tojson }}
            {{- "}" }}
        {%- endif %}
        {%- if builtin_tools is defined %}
            {#- This means we're in ipython mode #}
            {{- "<|eom_id|>" }}
        {%- else %}
            {{- "<|eot_id|>" }}
        {%- endif %}
    {%- elif message.role == "tool" or message.role == "ipython" %}
        {{- "<|start_header_id|>ipython<|end_header_id|>\n\n" }}
        {%- if message.content is mapping or message.content is iterable %}
            {{- message.content | tojson }}
        {%- else %}
            {{- message.content }}
        {%- endif %}
        {{- "<|eot_id|>" }}
    {%- endif %}
{%- endfor %}
{%- if add_generation_prompt %}
    {{- '<|start_header_id|>assistant<|end_header_id|>\n\n' }}
{%- endif %}
"""

LLAMA30_TEMPLATE = (
    "{% set loop_messages = messages %}{% for message in loop_messages %}{% set content = '<|start_header_id|>' + "
    "message['role'] + '<|end_header_id|>\n\n'+ message['content'] | trim + '<|eot_id|>' %}{% if loop.index0 == 0 %}"
    "{% set content = bos_token + content %}{% endif %}{{ content }}{% endfor %}{% if add_generation_prompt %}"
    "{{ '<|start_header_id|>assistant<|end_header_id|>\n\n' }}{% endif %}")

TEMPLATES = {"chatml": SMOLLM2_TEMPLATE, "qwen2.5": QWEN25_TEMPLATE, "qwen3": QWEN3_TEMPLATE,
             "llama3": LLAMA32_TEMPLATE, "llama3.1": LLAMA31_TEMPLATE, "llama3.0": LLAMA30_TEMPLATE}

CHATML_SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
LLAMA3_SPECIALS = ["<|begin_of_text|>", "<|end_of_text|>", "<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>"]

# token names per template: (specials, bos, eos, pad, generation eos list)
_TOKENS = {
    "chatml": (CHATML_SPECIALS, "<|im_start|>", "<|im_end|>", "<|im_end|>", ["<|im_end|>"]),
    "qwen2.5": (CHATML_SPECIALS, None, "<|im_end|>", "<|endoftext|>", ["<|im_end|>", "<|endoftext|>"]),
    "qwen3": (CHATML_SPECIALS, None, "<|im_end|>", "<|endoftext|>", ["<|im_end|>", "<|endoftext|>"]),
    "llama3": (LLAMA3_SPECIALS, "<|begin_of_text|>", "<|eot_id|>", None, ["<|end_of_text|>", "<|eot_id|>"]),
    "llama3.1": (LLAMA3_SPECIALS, "<|begin_of_text|>", "<|eot_id|>", None, ["<|end_of_text|>", "<|eot_id|>"]),
    "llama3.0": (LLAMA3_SPECIALS, "<|begin_of_text|>", "<|end_of_text|>", None, ["<|end_of_text|>", "<|eot_id|>"]),
}

CORPUS = """The capital of France is Paris. The capital of Italy is Rome. The capital of Japan is Tokyo.
What is the capital of Germany? Berlin is the capital of Germany, and it is a large city.
You are a helpful assistant. Answer the question with a short sentence, then stop.
Count the apples: there are 3 apples and 4 pears, so 7 fruits in total. 12 + 30 = 42. 1000 - 1 = 999.
def add(a, b):
    return a + b  # adds two numbers

for i in range(10):
    print(i * i)
The quick brown fox jumps over the lazy dog. A skill is a short text that helps a model solve a task.
Think step by step. First read the facts, then compute the answer, then write: The answer is 5.
Ünïcödé: café, naïve, résumé, 日本語, emoji 🙂 and symbols ✓ → ≤ ≥ ± °C.
User: hello there! Assistant: Hi, how can I help you today? It's a nice day, isn't it?
"""


def _corpus_lines() -> list[str]:
    lines = [line for line in CORPUS.splitlines() if line.strip()]
    return lines * 3


def make_tiny_tokenizer_dir(path, chat_format: str = "chatml", vocab_size: int = 400) -> Path:
    """Train a tiny byte-level BPE and write tokenizer.json + tokenizer_config.json (see module docstring)."""
    if chat_format not in TEMPLATES:
        raise ValueError(f"chat_format must be one of {sorted(TEMPLATES)}, got {chat_format!r}")
    specials, bos, eos, pad, _ = _TOKENS[chat_format]
    path = Path(path)
    path.mkdir(parents=True, exist_ok=True)
    tok = Tokenizer(models.BPE())
    # SmolLM2's pre-tokenizer: single digits, then GPT-2's byte-level regex split.
    tok.pre_tokenizer = pre_tokenizers.Sequence([pre_tokenizers.Digits(individual_digits=True),
                                                 pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)])
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=[AddedToken(s, special=True, normalized=False)
                                                                         for s in specials],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    tok.train_from_iterator(_corpus_lines(), trainer=trainer)
    if chat_format == "qwen3":  # Qwen3 has <think>/</think> as added tokens that are not special
        tok.add_tokens([AddedToken("<think>", special=False, normalized=False),
                        AddedToken("</think>", special=False, normalized=False)])
    tok.save(str(path / "tokenizer.json"))
    config = {"tokenizer_class": "PreTrainedTokenizerFast", "clean_up_tokenization_spaces": False,
              "model_max_length": 2048, "bos_token": bos, "eos_token": eos, "pad_token": pad,
              "chat_template": TEMPLATES[chat_format]}
    (path / "tokenizer_config.json").write_text(json.dumps(config, indent=2, ensure_ascii=False), encoding="utf-8")
    return path


_FAMILY = {
    "llama": dict(model_type="llama", architectures=["LlamaForCausalLM"], hidden_size=64, intermediate_size=128,
                  num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, head_dim=16,
                  attention_bias=False, mlp_bias=False, rope_theta=10000.0, rope_scaling=None),
    "qwen2": dict(model_type="qwen2", architectures=["Qwen2ForCausalLM"], hidden_size=64, intermediate_size=128,
                  num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, rope_theta=1000000.0,
                  rope_scaling=None, use_sliding_window=False, sliding_window=None, max_window_layers=2),
    "qwen3": dict(model_type="qwen3", architectures=["Qwen3ForCausalLM"], hidden_size=64, intermediate_size=128,
                  num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, head_dim=32,
                  attention_bias=False, rope_theta=1000000.0, rope_scaling=None, use_sliding_window=False,
                  sliding_window=None, max_window_layers=2),
}
_DEFAULT_CHAT = {"llama": "llama3", "qwen2": "qwen2.5", "qwen3": "qwen3"}


def tiny_state_dict(config: dict, seed: int = 0, init_std: float = 0.05) -> dict[str, torch.Tensor]:
    """Random float32 weights in Hugging Face names for a llama/qwen2/qwen3 config dict."""
    g = torch.Generator().manual_seed(seed)
    hidden, inter, vocab = config["hidden_size"], config["intermediate_size"], config["vocab_size"]
    n_heads, n_kv = config["num_attention_heads"], config["num_key_value_heads"]
    head_dim = config.get("head_dim") or hidden // n_heads
    qwen2 = config["model_type"] == "qwen2"
    bias = qwen2 or config.get("attention_bias", False)

    def normal(*shape, std=init_std):
        return torch.randn(*shape, generator=g) * std

    def norm(n):  # 1 + noise, so that a norm weight that is not applied changes the logits
        return 1.0 + normal(n, std=0.1)

    sd = {"model.embed_tokens.weight": normal(vocab, hidden), "model.norm.weight": norm(hidden)}
    for i in range(config["num_hidden_layers"]):
        p = f"model.layers.{i}."
        sd[p + "input_layernorm.weight"] = norm(hidden)
        sd[p + "post_attention_layernorm.weight"] = norm(hidden)
        for name, rows in (("q_proj", n_heads * head_dim), ("k_proj", n_kv * head_dim), ("v_proj", n_kv * head_dim)):
            sd[p + f"self_attn.{name}.weight"] = normal(rows, hidden)
            if bias:
                sd[p + f"self_attn.{name}.bias"] = normal(rows, std=0.1)
        sd[p + "self_attn.o_proj.weight"] = normal(hidden, n_heads * head_dim)
        if bias and not qwen2:  # llama-style attention_bias also has an o_proj bias
            sd[p + "self_attn.o_proj.bias"] = normal(hidden, std=0.1)
        if config["model_type"] == "qwen3":
            sd[p + "self_attn.q_norm.weight"] = norm(head_dim)
            sd[p + "self_attn.k_norm.weight"] = norm(head_dim)
        sd[p + "mlp.gate_proj.weight"] = normal(inter, hidden)
        sd[p + "mlp.up_proj.weight"] = normal(inter, hidden)
        sd[p + "mlp.down_proj.weight"] = normal(hidden, inter)
    if not config.get("tie_word_embeddings", True):
        sd["lm_head.weight"] = normal(vocab, hidden)
    return sd


def make_tiny_model_dir(path, family: str = "llama", tied: bool = True, chat_format: str | None = None,
                        seed: int = 0, shards: int = 1, init_std: float = 0.05, **config_overrides) -> Path:
    """Write a random tiny HF checkpoint folder (config, safetensors, tokenizer, generation config)."""
    if family not in _FAMILY:
        raise ValueError(f"family must be one of {sorted(_FAMILY)}, got {family!r}")
    chat_format = chat_format or _DEFAULT_CHAT[family]
    path = Path(path)
    make_tiny_tokenizer_dir(path, chat_format)
    tok = Tokenizer.from_file(str(path / "tokenizer.json"))
    _, bos, eos, pad, gen_eos = _TOKENS[chat_format]

    def tid(token):
        return None if token is None else tok.token_to_id(token)

    config = dict(_FAMILY[family], vocab_size=tok.get_vocab_size(with_added_tokens=True), hidden_act="silu",
                  max_position_embeddings=256, rms_norm_eps=1e-6, initializer_range=0.02,
                  tie_word_embeddings=tied, use_cache=True, torch_dtype="float32",
                  bos_token_id=tid(bos), eos_token_id=tid(eos), pad_token_id=tid(pad))
    config.update(config_overrides)
    (path / "config.json").write_text(json.dumps(config, indent=2), encoding="utf-8")
    gen_ids = [tid(t) for t in gen_eos]
    generation = {"bos_token_id": tid(bos), "eos_token_id": gen_ids if len(gen_ids) > 1 else gen_ids[0]}
    if pad is not None:
        generation["pad_token_id"] = tid(pad)
    (path / "generation_config.json").write_text(json.dumps(generation, indent=2), encoding="utf-8")

    sd = tiny_state_dict(config, seed=seed, init_std=init_std)
    names = list(sd)
    if shards <= 1:
        save_file(sd, str(path / "model.safetensors"), metadata={"format": "pt"})
    else:
        weight_map = {}
        for k in range(shards):
            file = f"model-{k + 1:05d}-of-{shards:05d}.safetensors"
            part = {n: sd[n] for n in names[k::shards]}
            save_file(part, str(path / file), metadata={"format": "pt"})
            weight_map.update({n: file for n in part})
        total = sum(t.numel() * t.element_size() for t in sd.values())
        index = {"metadata": {"total_size": total}, "weight_map": weight_map}
        (path / "model.safetensors.index.json").write_text(json.dumps(index, indent=2), encoding="utf-8")
    return path
