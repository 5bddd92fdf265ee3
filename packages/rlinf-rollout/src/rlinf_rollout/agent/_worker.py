"""``AgentRolloutWorker``: the LLM rollout worker that runs whole tool-using episodes (and builds SFT demos)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

from rlinf_models.llm import load_tokenizer
from rlinf_scheduler import shard_bounds

from ..llm._worker import LLMRolloutWorker
from ._chat import DEFAULT_AGENT_INSTRUCTIONS, ChatFormatter, ChatTokenizer, build_system_prompt
from ._config import ToolsConfig, build_toolbox
from ._loop import AgentLoop, AgentLoopConfig
from ._parse import parse_turn
from ._retriever import RetrieverClient

if TYPE_CHECKING:
    from rlinf_models.llm import LLMModelConfig

    from ..llm import LLMRolloutConfig

__all__ = ["AgentRolloutWorker"]


class AgentRolloutWorker(LLMRolloutWorker):
    """An :class:`~rlinf_rollout.llm.LLMRolloutWorker` that also runs the multi-turn agent loop.

    A request is a mapping with ``"prompt_ids"`` (an encoded first prompt), ``"messages"`` (a chat) or
    ``"question"`` (one user message); a system message listing the tools is put first when a chat has none. Every other key is passed through to the
    episode's ``meta`` (e.g. ``"answer"``). Like :meth:`generate`, :meth:`run_episodes` takes this rank's
    contiguous share of the requests (``shard=True``), so concatenating the ranks' results in rank order gives
    one episode per request, in request order.

    Args:
        cfg: the ``rollout`` config (engine, sampling).
        model_cfg: the model (the actor's ``actor.model``).
        agent: the loop limits (config ``agent``).
        tools: the tools.
        instructions: the system prompt's instructions (default :data:`DEFAULT_AGENT_INSTRUCTIONS`).
        base_dir: directory relative tool paths (the corpus) are resolved against.
        retriever_group: the name of the retriever worker group serving ``search`` (``tools.search_backend:
            service``); its ranks are looked up on the first search.
    """

    def __init__(
        self,
        cfg: LLMRolloutConfig,
        model_cfg: LLMModelConfig,
        agent: AgentLoopConfig,
        tools: ToolsConfig,
        *,
        instructions: str | None = None,
        base_dir: str | None = None,
        retriever_group: str | None = None,
    ) -> None:
        super().__init__(cfg, model_cfg)
        self.tokenizer = load_tokenizer(model_cfg)
        retriever = None
        if tools.search_backend == "service":
            if retriever_group is None:
                raise ValueError("tools.search_backend is 'service': the rollout needs 'retriever_group'")
            group = retriever_group
            retriever = RetrieverClient(
                group,
                namespace=self.namespace,
                world_size=lambda: self.group_world_size(group),
                timeout_s=tools.timeout_s,
            )
        self.toolbox = build_toolbox(
            tools, base_dir=Path(base_dir) if base_dir else None, retriever=retriever
        )
        # transformers annotates decode() as ``str | list[str]`` (batches); one id sequence decodes to a str.
        self.formatter = ChatFormatter(
            cast(ChatTokenizer, self.tokenizer),
            tool_role=agent.tool_role,
            wrap_tool_response=agent.wrap_tool_response,
        )
        self.loop = AgentLoop(self.engine, self.formatter, self.toolbox, agent)
        self.system_prompt = build_system_prompt(self.toolbox, instructions or DEFAULT_AGENT_INSTRUCTIONS)

    def _prompt_ids(self, request: Mapping[str, Any]) -> list[int]:
        if "prompt_ids" in request:
            return [int(t) for t in request["prompt_ids"]]
        return self.loop.prompt_ids(self._messages(request))

    def _messages(self, request: Mapping[str, Any]) -> list[dict[str, str]]:
        if "messages" in request:
            messages = [dict(m) for m in request["messages"]]
        elif "question" in request:
            messages = [{"role": "user", "content": str(request["question"])}]
        else:
            raise ValueError(
                f"an agent request needs 'prompt_ids', 'messages' or 'question'; got keys {sorted(request)}"
            )
        if not any(m.get("role") == "system" for m in messages):
            messages.insert(0, {"role": "system", "content": self.system_prompt})
        return messages

    def _share(self, items: Sequence[Any], shard: bool) -> Sequence[Any]:
        if not shard:
            return items
        start, stop = shard_bounds(len(items), self.rank, self.world_size)
        return items[start:stop]

    def run_episodes(
        self,
        requests: Sequence[Mapping[str, Any]],
        sampling: Mapping[str, Any] | None = None,
        *,
        shard: bool = True,
    ) -> list[dict[str, Any]]:
        """Run one episode per request (this rank's share when ``shard``).

        Args:
            requests: ``{"prompt_ids" | "messages" | "question", **meta}`` per episode.
            sampling: overrides of ``cfg.sampling`` (``max_new_tokens`` and ``stop`` are set per turn).
            shard: take only this rank's share of ``requests``.

        Returns:
            :meth:`AgentEpisode.to_dict` per episode: ``prompt_ids``, ``token_ids``, ``loss_mask``,
            ``rollout_logprobs``, ``turns``, ``answer``, ``finish_reason``, ``meta``, ``response_text``,
            ``num_tool_calls``, ``num_tool_errors``.
        """
        mine = self._share(requests, shard)
        params = self.cfg.sampling.updated(sampling)
        prompts = [self._prompt_ids(r) for r in mine]
        metas = [
            {k: v for k, v in r.items() if k not in ("prompt_ids", "messages", "question")} for r in mine
        ]
        reload = self._offloaded and self.cfg.enable_offload
        if reload:
            self.onload()
        try:
            with self.timer("agent_episodes"):
                episodes = self.loop.run(prompts, params, metas=metas) if prompts else []
        finally:
            if reload:
                self.offload()
        return [e.to_dict() for e in episodes]

    def build_demonstrations(
        self, requests: Sequence[Mapping[str, Any]], *, shard: bool = True
    ) -> list[dict[str, Any]]:
        """Token ids of tool-use demonstrations for SFT, built with the real tools and chat template.

        A request holds the chat (``"messages"``/``"question"``) and ``"demo"``: the assistant turns as text,
        e.g. ``['<tool_call>{...}</tool_call>', '<answer>391</answer>']``. Each turn but the last must hold
        tool calls; they are executed with this worker's toolbox and their responses inserted exactly as in a
        rollout. The last turn is closed with the eos token.

        Returns:
            Per request: ``prompt_ids``, ``token_ids`` (prompt + turns + tool responses) and ``loss_mask``
            (1 exactly on the assistant turns' tokens, eos included).

        Raises:
            ValueError: naming the request when a non-final turn holds no tool call.
        """
        out = []
        eos = self.formatter.eos_token_id
        for n, request in enumerate(self._share(requests, shard)):
            turns = list(request.get("demo", ()))
            if not turns:
                raise ValueError(f"demonstration {n} has no 'demo' turns")
            prompt = self._prompt_ids(request)
            ids, mask = list(prompt), [0] * len(prompt)
            for k, text in enumerate(turns):
                turn_ids = self.formatter.encode(str(text))
                if k == len(turns) - 1 and eos is not None:
                    turn_ids.append(eos)
                ids += turn_ids
                mask += [1] * len(turn_ids)
                if k == len(turns) - 1:
                    break
                parsed = parse_turn(str(text))
                if not parsed.tool_calls:
                    raise ValueError(f"demonstration {n}, turn {k}: only the last turn may lack a tool call")
                responses = [text for text, _ in self.toolbox.execute_many(parsed.tool_calls)]
                tool_ids = self.formatter.tool_turn_ids(responses)
                ids += tool_ids
                mask += [0] * len(tool_ids)
            out.append({"prompt_ids": prompt, "token_ids": ids, "loss_mask": mask})
        return out

    def shutdown_engine(self) -> None:
        """Release the engine and the tools' threads."""
        self.toolbox.close()
        super().shutdown_engine()
