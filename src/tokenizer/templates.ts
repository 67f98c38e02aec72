// Chat templates shipped with rstar2, as Jinja source (the same text goes into tokenizer_config.json's
// `chat_template`, so Python's transformers renders them identically). Jinja string escapes apply inside
// the templates: '\n' is a newline and '\\boxed' renders as \boxed.

// Qwen2.5 system/tools block and message loop. Shared by the three templates; only the wording differs.
const TOOLS_BLOCK = String.raw`{{- "\n\n# Tools\n\nYou may call one or more functions to assist with the user query.\n\nYou are provided with function signatures within <tools></tools> XML tags:\n<tools>" }}
    {%- for tool in tools %}
        {{- "\n" }}
        {{- tool | tojson }}
    {%- endfor %}
    {{- "\n</tools>\n\nFor each function call, return a json object with function name and arguments within <tool_call></tool_call> XML tags:\n<tool_call>\n{\"name\": <function-name>, \"arguments\": <args-json-object>}\n</tool_call><|im_end|>\n" }}`;

// `USER_PREFIX_EXPR` is a Jinja expression prepended to the content of plain-content turns.
function messageLoop(userPrefixExpr: string): string {
  return String.raw`{%- for message in messages %}
    {%- if (message.role == "user") or (message.role == "system" and not loop.first) or (message.role == "assistant" and not message.tool_calls) %}
        {{- '<|im_start|>' + message.role + '\n' + ${userPrefixExpr} + message.content + '<|im_end|>' + '\n' }}
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
{%- endfor %}`;
}

function systemBlock(defaultSystemExpr: string, toolsBlock: string): string {
  return String.raw`{%- if tools %}
    {{- '<|im_start|>system\n' }}
    {%- if messages[0]['role'] == 'system' %}
        {{- messages[0]['content'] }}
    {%- else %}
        {{- ${defaultSystemExpr} }}
    {%- endif %}
    ${toolsBlock}
{%- else %}
    {%- if messages[0]['role'] == 'system' %}
        {{- '<|im_start|>system\n' + messages[0]['content'] + '<|im_end|>\n' }}
    {%- else %}
        {{- '<|im_start|>system\n' + ${defaultSystemExpr} + '<|im_end|>\n' }}
    {%- endif %}
{%- endif %}`;
}

export const RSTAR2_SYSTEM_PROMPT =
  'A conversation between User and Assistant. The User asks a question, and the Assistant solves it. The ' +
  'Assistant first thinks about the reasoning process in the mind and then provides the User with the answer. ' +
  'The reasoning process is enclosed within <reason> </reason> and answer is enclosed within <answer> </answer> ' +
  'tags, respectively, i.e., <reason> reasoning process here </reason> <answer> answer here </answer>.';

export const RSTAR2_USER_PREFIX =
  'You must put your answer inside <answer> </answer> tags, i.e., <answer> answer here </answer>. And your ' +
  'final answer will be extracted automatically by the \\boxed{} tag.\nThis is the problem:\n';

// Jinja single-quoted literal for a plain string.
function jinjaString(s: string): string {
  return `'${s.replaceAll('\\', '\\\\').replaceAll("'", "\\'").replaceAll('\n', '\\n')}'`;
}

// rStar2 training template (reference `custom_chat_template`). The reference injects the user prefix into every
// plain-content turn, including assistant turns without tool calls and non-first system turns; that quirk is on
// unless the render variable `rstar2_prefix_quirk` is false (then only user turns get the prefix).
export const RSTAR2_TEMPLATE = String.raw`{%- set rstar2_system = ${jinjaString(RSTAR2_SYSTEM_PROMPT)} %}
{%- set rstar2_prefix = ${jinjaString(RSTAR2_USER_PREFIX)} %}
{%- set rstar2_quirk = rstar2_prefix_quirk is not defined or rstar2_prefix_quirk %}
${systemBlock('rstar2_system', TOOLS_BLOCK)}
${messageLoop("(rstar2_prefix if (message.role == 'user' or rstar2_quirk) else '')")}
{%- if add_generation_prompt %}
    {{- '<|im_start|>assistant\n<reason>' }}
{%- endif %}
`;

export const QWEN_SYSTEM_PROMPT = 'You are Qwen, created by Alibaba Cloud. You are a helpful assistant.';

// Plain Qwen2.5-Instruct / Hermes tool template.
export const QWEN_TEMPLATE = String.raw`${systemBlock(jinjaString(QWEN_SYSTEM_PROMPT), TOOLS_BLOCK)}
${messageLoop("''")}
{%- if add_generation_prompt %}
    {{- '<|im_start|>assistant\n' }}
{%- endif %}
`;

export const COMPACT_SYSTEM_PROMPT = 'Reason, then answer in <answer>\\boxed{}</answer>.';

// For tiny from-scratch models: same tokens and turn structure as rstar2, but a one-line system prompt and a
// one-line tool description, so the prompt is ~100 characters instead of ~1500.
const COMPACT_TOOLS_BLOCK = String.raw`{{- "\nTools:" }}
    {%- for tool in tools %}
        {{- " " + tool.function.name + "(" + (tool.function.parameters.required | join(", ")) + ")" }}
    {%- endfor %}
    {{- "\nCall: <tool_call>\n{\"name\": ..., \"arguments\": {...}}\n</tool_call><|im_end|>\n" }}`;

export const COMPACT_TEMPLATE = String.raw`${systemBlock(jinjaString(COMPACT_SYSTEM_PROMPT), COMPACT_TOOLS_BLOCK)}
${messageLoop("''")}
{%- if add_generation_prompt %}
    {{- '<|im_start|>assistant\n<reason>' }}
{%- endif %}
`;

// The quickstart's from-scratch model: the compact structure and tokens with a system turn of a few
// characters (the model learns the tool-call format from demos, not from the prompt), so each training
// sequence is ~150 characters shorter.
export const QUICK_SYSTEM_PROMPT = 'Use python.';
const QUICK_TOOLS_BLOCK = String.raw`{{- "<|im_end|>\n" }}`;

export const QUICK_TEMPLATE = String.raw`${systemBlock(jinjaString(QUICK_SYSTEM_PROMPT), QUICK_TOOLS_BLOCK)}
${messageLoop("''")}
{%- if add_generation_prompt %}
    {{- '<|im_start|>assistant\n<reason>' }}
{%- endif %}
`;

export const TEMPLATES = {
  rstar2: RSTAR2_TEMPLATE,
  qwen: QWEN_TEMPLATE,
  compact: COMPACT_TEMPLATE,
  quick: QUICK_TEMPLATE,
} as const;
export type TemplateName = keyof typeof TEMPLATES;
export const TEMPLATE_NAMES = Object.keys(TEMPLATES) as TemplateName[];
