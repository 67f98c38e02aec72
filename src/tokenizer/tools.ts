// The tool schema the model sees in its system prompt. Text and key order are exactly the reference's
// `python_tool_config.yaml` as pydantic dumps it (type, function{name, description, parameters}), because the
// rendered prompt must be byte-identical to the one rStar2 trained on.

export interface ToolParameter {
  type: string;
  description?: string;
  enum?: string[];
}

export interface ToolSchema {
  type: 'function';
  function: {
    name: string;
    description: string;
    parameters: {
      type: 'object';
      properties: Record<string, ToolParameter>;
      required?: string[];
    };
  };
}

/**
 * A tool as chat templates take it (OpenAI's `tools` entries): any function, its parameters as its source wrote
 * them. SFT examples carry their own; the rollout tool is a ToolSchema.
 */
export interface ToolSpec {
  type: 'function';
  function: { name: string; description?: string; parameters?: unknown };
}

export const PYTHON_TOOL_NAME = 'python_code_with_standard_io';

export const PYTHON_TOOL_SCHEMA: ToolSchema = {
  type: 'function',
  function: {
    name: PYTHON_TOOL_NAME,
    description:
      'Execute Python code with standard input and capture standard output. This function takes a Python code ' +
      'string and an input string, provides the input string through standard input (stdin) to the code, and ' +
      'captures and returns any output produced through standard output (stdout). If the executed code raises an ' +
      'exception, the error message will be captured and returned instead.',
    parameters: {
      type: 'object',
      properties: {
        code: {
          type: 'string',
          description:
            'A string containing Python code to be executed. The code can read from standard input using the ' +
            'input() function.',
        },
        input: {
          type: 'string',
          description: 'A string that will be provided as standard input to the code when it calls input().',
        },
      },
      required: ['code', 'input'],
    },
  },
};

/**
 * The tool rollouts serve (recipe `tool`): the python tool under `name`, with the reference's text unless `schema`
 * gives another. The sandbox runs `code` with `input` on stdin whatever the tool is called, so a schema must take
 * `code` and may take `input`, nothing else that is required.
 */
export function rolloutToolSchema(name: string = PYTHON_TOOL_NAME, schema: unknown = null): ToolSchema {
  if (!/^[A-Za-z0-9_.-]{1,64}$/.test(name))
    throw new Error(`tool.name ${JSON.stringify(name)}: 1-64 letters, digits, '_', '.' or '-'`);
  if (schema === null || schema === undefined)
    return { ...PYTHON_TOOL_SCHEMA, function: { ...PYTHON_TOOL_SCHEMA.function, name } };
  const fn = (schema as { function?: Record<string, unknown> }).function;
  if ((schema as { type?: unknown }).type !== 'function' || typeof fn !== 'object' || fn === null)
    throw new Error("tool.schema: expected {type: 'function', function: {name, description, parameters}}");
  if (fn.name !== name)
    throw new Error(
      `tool.schema names ${JSON.stringify(fn.name)} but tool.name is ${JSON.stringify(name)}: give both the same name`,
    );
  const params = fn.parameters as {
    type?: unknown;
    properties?: Record<string, unknown>;
    required?: unknown;
  };
  if (
    typeof fn.description !== 'string' ||
    params?.type !== 'object' ||
    typeof params.properties !== 'object'
  )
    throw new Error(
      'tool.schema.function: needs a description (string) and parameters {type: object, properties}',
    );
  if (!('code' in params.properties))
    throw new Error(
      `tool.schema: the sandbox runs the call's 'code' argument, and the schema has no 'code' parameter (it has: ${Object.keys(params.properties).join(', ') || 'none'})`,
    );
  const extra = Array.isArray(params.required)
    ? params.required.filter((r) => r !== 'code' && r !== 'input')
    : [];
  if (extra.length > 0)
    throw new Error(
      `tool.schema: requires ${extra.join(', ')}, which the sandbox does not take (it takes code and input)`,
    );
  return schema as ToolSchema;
}
