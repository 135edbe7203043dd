"""The math benchmarks the low-precision-RL papers train and evaluate on, in their hub schemas.

| task        | hub id (config; splits)                              | columns read                                 |
|-------------|------------------------------------------------------|----------------------------------------------|
| gsm8k       | openai/gsm8k (main; train, test)                     | question, answer ("... #### 72")             |
| math500     | HuggingFaceH4/MATH-500 (test)                        | problem, solution, answer, subject, level, unique_id |
| dapo_math   | BytedTsinghua-SIA/DAPO-Math-17k (train)              | data_source, prompt [{role, content}], ability, reward_model {ground_truth, style}, extra_info {index} |
| deepscaler  | agentica-org/DeepScaleR-Preview-Dataset (train)      | problem, answer, solution                    |
| aime24      | HuggingFaceH4/aime_2024 (train: the 30 problems)     | id, problem, solution, answer, url, year     |
| aime25      | math-ai/aime25 (test)                                | id, problem, answer                          |
| aime26      | MathArena/aime_2026 (train: the 30 problems)         | problem_idx (int64), problem, answer (int64) |
| amc23       | AI-MO/aimo-validation-amc (train: 83 problems)       | id, problem, answer (float64), url           |
| minerva     | math-ai/minervamath (test: 272 problems)             | question, answer                             |
| olympiadbench | math-ai/olympiadbench (test: 674)                  | id, question, final_answer (list), context, ... |

(olympiadbench is OlympiadBench's OE_TO_maths_en_COMP part: open-ended, text-only, English competition math.)

Schemas from the dataset cards (dataset_info in each README) and the hub file listings; how the field loads
and scores them from verl's preprocessors (examples/data_preprocess/gsm8k.py, math_dataset.py) and reward
functions (verl/utils/reward_score/gsm8k.py, math_dapo.py, math_verify.py). Minerva's and OlympiadBench's columns are
those that public loaders of those two hub copies read (their cards were not at hand).

Default prompts (user message; overridable with task.prompt_template, placeholder {problem}):
* math_verify reward: "{problem} Let's think step by step and output the final answer within \\boxed{}."
  (verl examples/data_preprocess/math_dataset.py; the same instruction is used for every math set here);
* gsm8k_strict reward: "{problem} Let's think step by step and output the final answer after \"####\"."
  (verl examples/data_preprocess/gsm8k.py);
* dapo reward: the DAPO prompt, "Solve the following math problem step by step. The last line of your
  response should be of the form Answer: $Answer ...", which DAPO-Math-17k stores in its own `prompt` column
  (dapo_math sends that message unchanged).

AIME, AMC, MATH-500, Minerva and OlympiadBench are evaluation sets: their train split is empty unless
task.train_split names one. Minerva and OlympiadBench complete QuRL Table 3's five (DeepScaleR's evaluation sets).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any, Optional

from bench.rewards import gold_text, gsm8k_gold, last_boxed
from bench.tasks.base import Example
from bench.registry import TASKS
from bench.tasks.hub_task import HubTask, HubTaskConfig

BOXED_PROMPT = "{problem} Let's think step by step and output the final answer within \\boxed{}."
GSM8K_PROMPT = "{problem} Let's think step by step and output the final answer after \"####\"."
DAPO_PREFIX = ("Solve the following math problem step by step. The last line of your response should be of the "
               "form Answer: $Answer (without quotes) where $Answer is the answer to the problem.\n\n")
DAPO_SUFFIX = "\n\nRemember to put your answer on its own line after \"Answer:\"."
DAPO_PROMPT = DAPO_PREFIX + "{problem}" + DAPO_SUFFIX

MATH_TEMPLATES = {"math_verify": BOXED_PROMPT, "dapo": DAPO_PROMPT}
_CALCULATOR = re.compile(r"<<[^<>]*>>")  # GSM8K's calculator annotations, "<<48/2=24>>"
_MATH_DELIMITER = re.compile(r"(?<!\\)\$")  # an unescaped "$" (OlympiadBench writes its answers in $...$)


def _text(value: Any, column: str) -> str:
    if not isinstance(value, str) or not value.strip():
        raise ValueError(f"column {column!r} must be non-empty text, got {value!r:.80}")
    return value


class MathTask(HubTask):
    """A math set: problem text in, one final answer out, scored by math_verify (default) or dapo."""

    default_templates = MATH_TEMPLATES

    def final_line(self, ex: Example) -> str:
        answer = ex["answer"]
        if self.cfg.reward == "gsm8k_strict":
            return f"#### {answer}"
        if self.cfg.reward == "dapo":
            return f"Answer: {answer}"
        return f"The final answer is $\\boxed{{{answer}}}$."

    def target(self, ex: Example) -> str:
        solution = ex.get("solution") or ""
        if self.cfg.reward == "math_verify" and last_boxed(solution) is not None:
            return solution.strip()  # MATH-style solutions already end in \boxed{answer}
        return super().target(ex)


@dataclass
class EvalSetConfig(HubTaskConfig):
    """An evaluation set: a published test split and no training split; responses up to 4,096 tokens."""

    train_split: Optional[str] = None
    test_split: Optional[str] = "test"
    max_new_tokens: int = 4096


# ---- GSM8K ---------------------------------------------------------------------------------------------


@dataclass
class Gsm8kTaskConfig(HubTaskConfig):
    source: str = "openai/gsm8k"
    config: Optional[str] = "main"
    max_new_tokens: int = 1024


@TASKS.register("gsm8k", schema=Gsm8kTaskConfig)
class Gsm8kTask(MathTask):
    """GSM8K (Cobbe et al. 2021). Gold: the text after '#### ' of the reference answer, commas removed."""

    config_class = Gsm8kTaskConfig
    required_columns = ("question", "answer")
    default_templates = {**MATH_TEMPLATES, "gsm8k_strict": GSM8K_PROMPT}

    def adapt(self, row: dict[str, Any], index: int, split: str) -> Example:
        full = _text(row["answer"], "answer")
        if "####" not in full:
            raise ValueError("the answer has no '#### <number>' line")
        reasoning = _CALCULATOR.sub("", full.rsplit("####", 1)[0]).strip()
        return {"id": f"{split}-{index}", "problem": _text(row["question"], "question").strip(),
                "answer": gsm8k_gold(full), "solution": full, "reasoning": reasoning}


# ---- MATH-500 ------------------------------------------------------------------------------------------


@dataclass
class Math500TaskConfig(EvalSetConfig):
    source: str = "HuggingFaceH4/MATH-500"


@TASKS.register("math500", schema=Math500TaskConfig)
class Math500Task(MathTask):
    """MATH-500 (Lightman et al. 2023's 500-problem subset of MATH test), an evaluation set."""

    config_class = Math500TaskConfig
    required_columns = ("problem", "solution", "answer", "unique_id")

    def adapt(self, row: dict[str, Any], index: int, split: str) -> Example:
        return {"id": str(row["unique_id"]), "problem": _text(row["problem"], "problem"),
                "answer": _text(gold_text(row["answer"]), "answer"), "solution": row.get("solution"),
                "subject": row.get("subject"), "level": row.get("level")}


# ---- DAPO-Math-17k -------------------------------------------------------------------------------------


@dataclass
class DapoMathTaskConfig(HubTaskConfig):
    source: str = "BytedTsinghua-SIA/DAPO-Math-17k"
    test_split: Optional[str] = None
    test_size: int = 500  # DAPO evaluates on AIME 2024; this held-out slice is for quick in-run checks
    reward: str = "dapo"
    max_new_tokens: int = 4096


def dapo_problem(content: str) -> str:
    """The bare problem inside DAPO's prompt text (its instruction prefix and reminder suffix removed)."""
    text = content
    if text.startswith(DAPO_PREFIX):
        text = text[len(DAPO_PREFIX):]
    if text.endswith(DAPO_SUFFIX):
        text = text[: -len(DAPO_SUFFIX)]
    return text.strip()


@TASKS.register("dapo_math", schema=DapoMathTaskConfig)
class DapoMathTask(MathTask):
    """DAPO-Math-17k (Yu et al. 2025). The prompt column is already a chat message list in DAPO's format.

    The hub file holds every problem many times over; rows are de-duplicated by problem text on load.
    """

    config_class = DapoMathTaskConfig
    required_columns = ("prompt", "reward_model")

    def adapt(self, row: dict[str, Any], index: int, split: str) -> Example:
        messages = row["prompt"]
        if not isinstance(messages, list) or not messages:
            raise ValueError(f"'prompt' must be a non-empty list of {{role, content}} messages, got {messages!r:.80}")
        messages = [{"role": str(m["role"]), "content": _text(m["content"], "prompt.content")} for m in messages]
        user = [m["content"] for m in messages if m["role"] == "user"]
        if not user:
            raise ValueError("'prompt' has no user message")
        extra = row.get("extra_info") or {}
        return {"id": str(extra.get("index", index)), "problem": dapo_problem(user[-1]),
                "answer": _text(gold_text(row["reward_model"]["ground_truth"]), "reward_model.ground_truth"),
                "dataset_messages": messages, "data_source": row.get("data_source")}

    def messages(self, ex: Example) -> list[dict[str, str]]:
        """DAPO's own prompt messages, unless a template or system prompt is configured."""
        if self.cfg.prompt_template is None and self.cfg.system_prompt is None and self.cfg.reward == "dapo":
            return [dict(m) for m in ex["dataset_messages"]]
        return super().messages(ex)

    def prompt(self, ex: Example) -> str:
        if self.cfg.prompt_template is None and self.cfg.reward == "dapo":
            return "\n\n".join(m["content"] for m in ex["dataset_messages"] if m["role"] == "user")
        return super().prompt(ex)


# ---- DeepScaleR ----------------------------------------------------------------------------------------


@dataclass
class DeepScaleRTaskConfig(HubTaskConfig):
    source: str = "agentica-org/DeepScaleR-Preview-Dataset"
    test_split: Optional[str] = None
    test_size: int = 500
    max_new_tokens: int = 4096


@TASKS.register("deepscaler", schema=DeepScaleRTaskConfig)
class DeepScaleRTask(MathTask):
    """DeepScaleR-Preview (Luo et al. 2025): AIME/AMC/Omni-MATH/STILL problems with answers and solutions."""

    config_class = DeepScaleRTaskConfig
    required_columns = ("problem", "answer")

    def adapt(self, row: dict[str, Any], index: int, split: str) -> Example:
        return {"id": f"{split}-{index}", "problem": _text(row["problem"], "problem"),
                "answer": _text(gold_text(row["answer"]), "answer"), "solution": row.get("solution")}


# ---- AIME 2024 / 2025 / 2026, AMC 2023 ------------------------------------------------------------------


@dataclass
class Aime24TaskConfig(EvalSetConfig):
    source: str = "HuggingFaceH4/aime_2024"
    test_split: Optional[str] = "train"  # the hub calls its only split "train"


@dataclass
class Aime25TaskConfig(EvalSetConfig):
    source: str = "math-ai/aime25"


@dataclass
class Aime26TaskConfig(EvalSetConfig):
    source: str = "MathArena/aime_2026"
    test_split: Optional[str] = "train"  # the hub calls its only split "train"


@dataclass
class Amc23TaskConfig(EvalSetConfig):
    source: str = "AI-MO/aimo-validation-amc"
    test_split: Optional[str] = "train"  # the hub calls its only split "train"


class CompetitionTask(MathTask):
    """AIME / AMC problems: an id (MathArena's `problem_idx`), the problem, a numeric answer (AMC's is stored as
    float64: 142.0 -> "142"; MathArena's as int64)."""

    required_columns = ("problem", "answer")

    def adapt(self, row: dict[str, Any], index: int, split: str) -> Example:
        return {"id": str(row.get("id", row.get("problem_idx", index))), "problem": _text(row["problem"], "problem"),
                "answer": _text(gold_text(row["answer"]), "answer"), "solution": row.get("solution"),
                "url": row.get("url")}


@TASKS.register("aime24", schema=Aime24TaskConfig)
class Aime24Task(CompetitionTask):
    config_class = Aime24TaskConfig


@TASKS.register("aime25", schema=Aime25TaskConfig)
class Aime25Task(CompetitionTask):
    config_class = Aime25TaskConfig


@TASKS.register("aime26", schema=Aime26TaskConfig)
class Aime26Task(CompetitionTask):
    config_class = Aime26TaskConfig


@TASKS.register("amc23", schema=Amc23TaskConfig)
class Amc23Task(CompetitionTask):
    config_class = Amc23TaskConfig


# ---- Minerva / OlympiadBench ---------------------------------------------------------------------------


@dataclass
class MinervaTaskConfig(EvalSetConfig):
    source: str = "math-ai/minervamath"


@TASKS.register("minerva", schema=MinervaTaskConfig)
class MinervaTask(MathTask):
    """Minerva Math (Lewkowycz et al. 2022's 272 undergraduate STEM problems, OCWCourses): numbers with units
    stripped, expressions, scientific notation; the hub copy stores the question and its final answer only."""

    config_class = MinervaTaskConfig
    required_columns = ("question", "answer")

    def adapt(self, row: dict[str, Any], index: int, split: str) -> Example:
        return {"id": f"{split}-{index}", "problem": _text(row["question"], "question"),
                "answer": _text(gold_text(row["answer"]), "answer")}


@dataclass
class OlympiadBenchTaskConfig(EvalSetConfig):
    source: str = "math-ai/olympiadbench"


def olympiad_answer(final_answer: Any) -> str:
    """OlympiadBench's gold: its `final_answer` list (one entry, or several when `is_multiple_answer`), each entry's
    math delimiters removed ("$\\frac{1}{2}$" -> "\\frac{1}{2}", "$2$, $3$" -> "2, 3"; an escaped "\\$" stays),
    joined by ", " so that math-verify reads several answers as one set; the scorer boxes the text (bench/rewards.py)."""
    items = final_answer if isinstance(final_answer, (list, tuple)) else [final_answer]
    parts = [_MATH_DELIMITER.sub("", gold_text(a)).strip() for a in items if a is not None]
    return ", ".join(p for p in parts if p)


@TASKS.register("olympiadbench", schema=OlympiadBenchTaskConfig)
class OlympiadBenchTask(MathTask):
    """OlympiadBench (He et al. 2024), its open-ended, text-only, English competition-math part (OE_TO_maths_en_COMP).
    A problem that refers to a shared setting has it in `context`, which is put before the question."""

    config_class = OlympiadBenchTaskConfig
    required_columns = ("question", "final_answer")

    def adapt(self, row: dict[str, Any], index: int, split: str) -> Example:
        question = _text(row["question"], "question")
        context = (row.get("context") or "").strip()
        solution = row.get("solution")
        return {"id": str(row.get("id", index)), "problem": f"{context}\n\n{question}" if context else question,
                "answer": _text(olympiad_answer(row["final_answer"]), "final_answer"),
                "solution": "\n\n".join(solution) if isinstance(solution, list) else solution,
                "answer_type": row.get("answer_type"), "subfield": row.get("subfield")}
