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
