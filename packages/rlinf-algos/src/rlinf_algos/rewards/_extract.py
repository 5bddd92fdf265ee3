r"""Final-answer extraction from model responses (pure string logic, no math-verify needed).

The rules follow RLinf's ``extract_answer(..., "math", use_last_number=False)``, in this order:

1. Minerva style ``final answer is $X$. I hope`` → ``X``;
2. the LAST ``\boxed{...}`` (brace-matched, nested braces allowed) → its content; ``\boxed X`` (a space
   instead of braces) → the text up to the next ``$`` or line end. A truncated ``\boxed{...`` with no closing
   brace is *no answer* (RLinf would take the unterminated rest);
3. the text after the last ``he answer is`` (``The answer is`` / ``the answer is``);
4. the text after the last ``final answer is``;
5. the text after ``答案是`` up to the next blank line.

Anything else has no answer. The extracted text is cleaned like RLinf does: line breaks and the indentation
after them removed, a leading ``:`` and trailing ``.`` / ``/`` dropped, surrounding ``$`` removed.
"""

from __future__ import annotations

import re

__all__ = ["extract_final_answer", "extract_reference_answer"]

_MINERVA_OPEN = "final answer is $"
_MINERVA_CLOSE = "$. I hope"
_BOXED = "\\boxed"


def _brace_content(text: str) -> str | None:
    """Content of the brace group opening at ``text[0] == "{"``; None when it never closes."""
    depth = 0
    for i, ch in enumerate(text):
        if ch == "{":
            depth += 1
        elif ch == "}":
            depth -= 1
            if depth == 0:
                return text[1:i]
    return None


def _boxed(text: str, start: int) -> str | None:
    rest = text[start + len(_BOXED) :]
    if rest.startswith("{"):
        return _brace_content(rest)
    if rest[:1].isspace():
        stripped = rest.strip()
        if not stripped:
            return None
        return stripped.split("$", 1)[0].split("\n", 1)[0]
    return None


def _clean(answer: str) -> str:
    answer = re.sub(r"\n\s*", "", answer).strip()
    if answer.startswith(":"):
        answer = answer[1:].strip()
    while answer.endswith((".", "/")):
        answer = answer[:-1].rstrip()
    if len(answer) >= 2 and answer.startswith("$") and answer.endswith("$"):
        answer = answer.strip("$").strip()
    return answer


def extract_final_answer(response: str) -> str | None:
    r"""The final answer a response commits to, or None when it gives none.

    Args:
        response: the decoded model output.

    Returns:
        The cleaned answer text (e.g. ``"\frac{1}{2}"``), or None (no pattern matched, an empty or
        unterminated ``\boxed{``).

    Example:
        >>> extract_final_answer(r"so $x=\boxed{2}$, i.e. \boxed{\frac{1}{2}}.")
        '\\frac{1}{2}'
        >>> extract_final_answer("I am not sure.") is None
        True
    """
    answer: str | None
    if _MINERVA_OPEN in response and _MINERVA_CLOSE in response:
        answer = response.split(_MINERVA_OPEN, 1)[1].split(_MINERVA_CLOSE, 1)[0]
    elif (idx := response.rfind(_BOXED)) >= 0:
        answer = _boxed(response, idx)
    elif "he answer is" in response:
        answer = response.rsplit("he answer is", 1)[1]
    elif "final answer is" in response:
        answer = response.rsplit("final answer is", 1)[1]
    elif "答案是" in response:
        answer = response.split("答案是", 1)[1].strip().split("\n\n", 1)[0]
    else:
        answer = None
    if answer is None:
        return None
    cleaned = _clean(answer)
    return cleaned or None


def extract_reference_answer(reference: str) -> str | None:
    r"""The answer of a reference: the extracted final answer when it has one, else the whole (cleaned) text.

    Args:
        reference: a ground-truth answer (``"\frac{1}{2}"``) or a worked solution ending in ``\boxed{...}``.

    Returns:
        The answer text, or None for an empty reference.
    """
    found = extract_final_answer(reference)
    if found is not None:
        return found
    cleaned = _clean(reference)
    return cleaned or None
