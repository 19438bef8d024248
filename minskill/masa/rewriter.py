"""The stage-2 rewriter at inference: what `rewrite.py apply` and `python -m
minskill.measure.transfer
--rewriter` share.

Given the target's model card, an input skill set S_in and a task description d, the trained
rewriter writes S*_F in one greedy pass (`rewrite_with_model`, the prompt of
minskill/masa/rewriter_sft.py's records):

    S*_F = parse(argmax-decode p_θ(· | chat(card, S_in, d)))

each token's argmax taken over the tokens the skill-set JSON schema allows next (the server's
constrained decoding, minskill/serve/constrained.py, run in process), so that the reply parses;
`--json-schema off` decodes freely, as the rewriter was trained.

Its reply is untrusted text: `parse_rewriter_output` accepts only the MASA JSON it was trained to
write (never free text re-read as Markdown), and `save_skills_validated` writes a skill folder only
after a trial copy reads back identically. `load_model_card` reads --model-card (a card file, an
evolve_masa.py run folder, a checkpoint folder or a model spec: the card of a spec or checkpoint is
built by the builder evolve_masa.py uses, so the rewriter sees the card it was trained with);
`resolve_rewriter` finds the weights of a `rewrite.py train` folder.
"""
from __future__ import annotations

import shutil
import tempfile
from pathlib import Path

from minskill.masa.model_card import as_model_card, read_card_file, target_model_card
from minskill.masa.reply_schema import skillset_schema
from minskill.masa.rewriter_sft import prompt_messages
from minskill.nn.sampling import generate
from minskill.replies import extract_json
from minskill.serve.backends import ModelBackend
from minskill.serve.errors import BackendError
from minskill.serve.request_parsing import parse_chat_request
from minskill.sft import latest_checkpoint
from minskill.skillsets import SkillSet


def load_model_card(spec: str) -> dict:
    """--model-card: a JSON or YAML card file (read leniently: unknown keys dropped); an
    evolve_masa.py run folder (its model_card.json: the card its SFT records were built with, the
    teacher's strengths and weaknesses included); or a checkpoint folder or model spec, whose card
    is built as evolve_masa.py builds it for that target before the teacher's summary
    (minskill.masa.model_card.target_model_card)."""
    path = Path(spec)
    if path.is_dir() and not (path / "config.json").is_file():
        if not (path / "model_card.json").is_file():
            raise FileNotFoundError(f"model card {spec}: the folder holds neither model_card.json "
                                    f"(an evolve_masa.py run) nor config.json (a checkpoint)")
        path = path / "model_card.json"     # a run folder
    if path.is_file():
        data, where = read_card_file(path, strict=False)
        return as_model_card(data, where).to_json()
    return target_model_card(spec).to_json()   # e.g. "smollm2-135m": its HF folder's config.json


def resolve_rewriter(spec: str) -> str:
    """--rewriter: an HF folder, a `rewrite.py train` output folder (its final/ or latest
    checkpoint) or a spec."""
    path = Path(spec)
    if path.is_dir() and not (path / "config.json").is_file():
        if (path / "final" / "config.json").is_file():
            return str(path / "final")
        checkpoint = latest_checkpoint(path)
        if checkpoint is None:
            raise FileNotFoundError(f"--rewriter {spec}: no config.json, final/ or checkpoint-*/ "
                                    f"in this folder")
        return str(checkpoint)
    return spec


def parse_rewriter_output(text: str, finish_reason: str = "stop"):
    """The SkillSet in a rewriter reply: the MASA JSON object it was trained to write (the text
    from its first "{" to its last "}": replies.extract_json(strict=True); a code fence or words
    around it are ignored). A small rewriter sometimes closes the object early and writes the rest
    of the set as a second object ({"general_skills": ...} {"task_specific_skills": ...});
    whitespace-separated objects whose keys are distinct skill-set keys are merged into one. Raises
    ValueError saying why it does not parse. Free text is never re-read leniently as Markdown (a
    garbled or cut-off reply would become the body of a broken skill), and an empty skill set
    counts as not parsed."""
    keys = {"general_skills", "task_specific_skills", "common_mistakes"}
    cut = " (the reply hit the token limit: raise --max-new-tokens)" \
        if finish_reason == "length" else ""
    try:
        data = extract_json(text, strict=True)
    except ValueError as e:
        raise ValueError(f"{e}{cut}") from None
    if isinstance(data, list):   # several objects in a row: the parts of one skill set, or no reply
        seen: set = set()
        for i, part in enumerate(data, 1):
            if not isinstance(part, dict) or not set(part) <= keys or seen & set(part):
                raise ValueError(f"the reply holds {len(data)} JSON values and value {i} is not a "
                                 f"further part of one skill set (distinct keys among "
                                 f"{sorted(keys)})")
            seen |= set(part)
        data = {k: v for part in data for k, v in part.items()}
    if not isinstance(data, dict) or not keys & set(data):
        raise ValueError("the JSON object has none of general_skills, task_specific_skills, "
                         "common_mistakes")
    try:
        skills = SkillSet.from_json(data, where="rewriter output")
    except ValueError as e:
        raise ValueError(f"not a valid MASA skill library: {e}") from None
    if not (skills.general or any(skills.task_specific.values()) or skills.common_mistakes):
        raise ValueError("the reply is an empty skill set")
    return skills


def save_skills_validated(skills, out: Path):
    """Write `skills` as an Agent Skills folder at `out`, only once a trial copy has read back
    identically."""
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    trial = Path(tempfile.mkdtemp(dir=out.parent, prefix=f".{out.name}.check-"))
    try:
        skills.save(trial / "set")
        if SkillSet.load(trial / "set").to_json() != skills.to_json():
            raise ValueError("the skills do not read back identically from an Agent Skills folder")
    finally:
        shutil.rmtree(trial, ignore_errors=True)
    skills.save(out)
    return SkillSet.load(out)


def rewrite_with_model(model, tokenizer, card: dict, skills, task: str, max_new_tokens: int = 1536,
                       temperature: float = 0.0, seed: int = 0, compiled: bool = False,
                       json_schema: bool = True) -> tuple[str, str]:
    """One rewriter pass: (raw reply text, finish reason). Greedy by default. json_schema: the
    reply is decoded under the skill-set schema its parser reads (reply_schema.skillset_schema, the
    input's task types), by the server's JSON-constrained decoding run in this process, so that it
    parses (or says it was cut); off: free decoding (generate; compiled: its opt-in compiled step,
    nn/compiled_decode.py)."""
    messages = prompt_messages(card, skills.to_json(), task)
    if json_schema:
        if compiled:
            raise ValueError("the compiled decoding step decodes free text: turn the JSON schema "
                             "off to use it")
        schema = skillset_schema(max_new_tokens, task_types=sorted(skills.task_specific))
        return constrained_reply(model, tokenizer, messages, schema, max_new_tokens, temperature,
                                 seed)
    prompt = tokenizer.apply_chat_template(messages, add_generation_prompt=True)
    sample = generate(model, [prompt], max_new_tokens=max_new_tokens, temperature=temperature,
                      seed=seed, stop_token_ids=tokenizer.stop_token_ids, tokenizer=tokenizer,
                      pad_id=tokenizer.pad_token_id, compiled=compiled)[0]
    return sample.text, sample.finish_reason


def constrained_reply(model, tokenizer, messages: list[dict], schema: dict, max_tokens: int,
                      temperature: float, seed: int) -> tuple[str, str]:
    """(text, finish reason) of `model`'s reply to `messages` under the JSON `schema`: the request
    a server would get with response_format json_schema, served in process by its backend (the same
    prompt, the same logits mask: minskill/serve/constrained.py)."""
    backend = ModelBackend(model, tokenizer, name="rewriter")
    try:
        request = parse_chat_request({
            "messages": messages, "max_tokens": max_tokens, "temperature": temperature,
            "seed": seed, "response_format": {"type": "json_schema", "json_schema": {
                "name": "skill_set", "schema": schema, "strict": True}}}, backend)
    except BackendError as error:   # a prompt longer than the model's context, say
        raise ValueError(f"the rewriter's request: {error}") from None
    choice = backend.complete([request])[0][0]
    return choice.text, choice.finish_reason
