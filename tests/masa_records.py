"""The shape of a MASA SFT record, as the tests check what evolve_masa.py writes (moved here from
minskill/masa/data.py, where nothing but the tests called it: issue 41)."""
from minskill.masa.data import SFT_SOURCES
from minskill.masa.model_card import ModelCard
from minskill.masa.rewriter_sft import sft_record_problem
from minskill.skillsets import SkillSet

# What MASA adds to a record of sft's schema (sft.RECORD_FIELDS: what the rewriter trains on): where the
# record comes from. sft reads a record without these and ignores them.
PROVENANCE_FIELDS = {"source": str, "target_model": str, "reward_out": (int, float)}


def check_sft_record(record: dict, where: str = "record") -> None:
    """Raise ValueError naming the problem if `record` is not a well-formed MASA SFT record: a record of
    sft's schema (sft.sft_record_problem) with MASA's provenance fields, whose card and skill sets parse."""
    problem = sft_record_problem(record)
    for key, kind in PROVENANCE_FIELDS.items():
        if problem is None and key not in record:
            problem = f"lacks field {key!r}"
        elif problem is None and not isinstance(record[key], kind):
            problem = f"field {key!r} has type {type(record[key]).__name__}"
    if problem is None and record["source"] not in SFT_SOURCES:
        problem = f"unknown source {record['source']!r}"
    if problem is not None:
        raise ValueError(f"{where}: {problem}")
    ModelCard.from_json(record["model_card"], where=f"{where}.model_card")
    for key in ("skills_in", "skills_out"):
        try:
            SkillSet.from_json(record[key])
        except Exception as e:
            raise ValueError(f"{where}.{key}: not a MASA skill library ({e})") from None
