import type { Tier } from "../state/admission-queue";
import { editMembers } from "./json-text";

// vLLM's own request priority (SPEC 9), for nodes whose document entry says they run
// `--scheduling-policy priority` (`"priorityScheduling": true`). vLLM's OpenAI protocol:
// `priority: int = 0`, "lower means earlier handling; any priority other than 0 will raise an
// error if the served model does not use priority scheduling" (vllm-project/vllm
// vllm/entrypoints/openai/chat_completion/protocol.py), so it is only ever sent to such nodes.
// `default` keeps vLLM's default 0, so requests that reach the engine another way rank alike.

const VLLM_PRIORITY: Record<Tier, number> = { priority: -1, default: 0, flex: 1 };

export const vllmPriorityOf = (tier: Tier): number => VLLM_PRIORITY[tier];

/** The body with `priority` set (a client's own value replaced: the tier decides). */
export const withPriority = (body: string, priority: number): string => editMembers(body, { priority: String(priority) });
