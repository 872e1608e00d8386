"""A Qwen-format (``<tool_call>``) episode with typed tools in a TorchRL ChatEnv.

Run: .venv/bin/python examples/torchrl_qwen_tools.py

Typed Python functions become tools (JSON Schema from the signature and the
docstring). Their OpenAI-style specs go into the chat template's ``tools=``,
so the prompt looks exactly like what a Qwen model was trained on; the
model's native ``<tool_call>`` output is parsed by the ``hermes`` family
parser, with no regex to write. No model or tokenizer is downloaded: the
assistant turns are scripted and the prompt is rendered with TorchRL's own
Qwen template through a tiny local stand-in for a tokenizer.
"""

from __future__ import annotations

import json
from typing import Any, Literal

import jinja2
from jinja2.ext import Extension
from tensordict import TensorDict, lazy_stack
from torchrl.data.llm import History
from torchrl.envs import TransformedEnv
from torchrl.envs.llm import ChatEnv

from toolservices import tool
from toolservices.torchrl import METRICS_KEY, ExecuteToolsInOrder, ToolRegistry


@tool
def get_weather(city: str, unit: Literal["celsius", "fahrenheit"] = "celsius") -> dict[str, Any]:
    """Current weather in a city.

    Args:
        city: The city name, e.g. "Paris".
        unit: Temperature unit.
    """
    celsius = {"Paris": 18.0, "Oslo": 4.5}.get(city, 21.0)
    value = celsius if unit == "celsius" else celsius * 9 / 5 + 32
    return {"city": city, "temperature": value, "unit": unit}


@tool
def convert(amount: float, rate: float) -> float:
    """Multiply an amount by an exchange rate.

    Args:
        amount: The amount of money.
        rate: The exchange rate.
    """
    return round(amount * rate, 2)


def call(name: str, **arguments: Any) -> str:
    return f"<tool_call>\n{json.dumps({'name': name, 'arguments': arguments})}\n</tool_call>"


SCRIPT = [
    [
        "I'll check both cities.\n"
        + call("get_weather", city="Paris")
        + "\n"
        + call("get_weather", city="Oslo", unit="fahrenheit"),
        call("convert", amount=120, rate="0.92"),  # a string the schema turns into a number
    ],
    ["Paris is 18 C and Oslo is 40.1 F.", call("convert", amount=120)],  # missing argument
    ["Anything else?", "120 USD is 110.4 EUR."],
]


class _Generation(Extension):
    """``{% generation %}`` marks assistant tokens for Hugging Face; here it renders as is."""

    tags = {"generation"}

    def parse(self, parser: Any) -> Any:
        next(parser.stream)
        return parser.parse_statements(("name:endgeneration",), drop_needle=True)


class TemplateOnlyTokenizer:
    """Enough of a tokenizer for ``History.apply_chat_template(tokenize=False)``."""

    def apply_chat_template(
        self,
        conversation: list[dict[str, Any]],
        *,
        chat_template: str,
        add_generation_prompt: bool = True,
        tools: list[dict[str, Any]] | None = None,
        **_: Any,
    ) -> str:
        env = jinja2.Environment(extensions=[_Generation], trim_blocks=True, lstrip_blocks=True)
        env.filters["tojson"] = json.dumps
        return env.from_string(chat_template).render(
            messages=conversation, tools=tools, add_generation_prompt=add_generation_prompt
        )


def main() -> None:
    registry = ToolRegistry([get_weather, convert])
    transform = ExecuteToolsInOrder(registry, "hermes", result_format="openai")
    env = TransformedEnv(
        ChatEnv(batch_size=(2,), system_prompt="You are a helpful agent."), transform
    )
    td = env.reset(
        TensorDict(query=["Weather in Paris and Oslo?", "120 USD in EUR at 0.92?"], batch_size=(2,))
    )
    prompt = (
        td["history"]
        .prompt[0]
        .apply_chat_template(
            tokenizer=TemplateOnlyTokenizer(), chat_template_name="qwen", tools=transform.tool_specs
        )
    )
    print("=== prompt of item 0, as the Qwen template renders it ===\n" + prompt)
    for turn, texts in enumerate(SCRIPT, start=1):
        history = td["history"]
        response = lazy_stack([History(role="assistant", content=t).unsqueeze(0) for t in texts])
        history.full = history.prompt.extend(response, inplace=False, dim=-1)
        history.response = response
        td["history"] = history
        out = env.step(td)["next"]
        metrics = {k: out[METRICS_KEY, k].tolist() for k in ("calls", "failed_calls")}
        print(f"turn {turn}: {metrics}")
        td = out.exclude("done", "terminated")
    final = (
        td["history"]
        .prompt[1]
        .apply_chat_template(
            tokenizer=TemplateOnlyTokenizer(), chat_template_name="qwen", tools=transform.tool_specs
        )
    )
    print("\n=== item 1 after three turns ===\n" + final.split("<|im_start|>user", 1)[1])
    env.close()


if __name__ == "__main__":
    main()
