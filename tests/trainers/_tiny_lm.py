"""A tiny causal LM built locally (no download) that always writes one tool call.

Every layer's output projection is zero, so the residual stream at each
position is the current token's embedding; embeddings are one-hot and the LM
head maps token ``i`` to a fixed successor with a large margin. The model is
therefore a deterministic bigram chain: after the assistant header it writes
``<tool_call>{"name": "python", "arguments": {"code": CODE}}</tool_call>``
then the end-of-turn token, whatever the prompt, and TRL parses a real tool
call out of real generated token ids. Each special piece is one added token,
so the chain never has two successors for one token.
"""

from __future__ import annotations

from typing import Any

import torch
from tokenizers import Tokenizer, decoders, models, pre_tokenizers
from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

#: The code the model sends to the python tool: a counter kept in the session.
CODE = "n = globals().get('n', 0) + 1; print(n)"
_CALL_HEAD = '<tool_call>\n{"name": "python", "arguments": {"code": "'
_CALL_TAIL = '"}}\n</tool_call>'
# A second call in the same turn: distinct tokens, so the chain stays a chain.
_SECOND_TAIL = '"}}\n</tool_call>\n'
_SECOND_HEAD = '<tool_call>\n{"name": "python", "arguments": {"code":  "'
_SECOND_CODE = CODE.replace("; ", ";  ")  # same snippet, another token


def build(chat_template: str, *, calls_per_turn: int = 1) -> tuple[Any, Any]:
    """(model, tokenizer) for ``chat_template`` (a Qwen-style template).

    With ``calls_per_turn=2`` each turn holds two calls of ``CODE``.
    """
    if calls_per_turn not in (1, 2):
        raise ValueError("calls_per_turn must be 1 or 2")
    pieces = [
        "<|im_start|>",
        "<|im_end|>",
        "<|endoftext|>",
        "<|im_start|>assistant\n",
        "<tool_response>\n",
        "\n</tool_response>",
        _CALL_HEAD,
        CODE,
        _CALL_TAIL,
        _SECOND_TAIL,
        _SECOND_HEAD,
        _SECOND_CODE,
    ]
    # Digits are in the vocabulary so that tool results (counts) survive a round trip.
    vocab = {"[UNK]": 0, **{str(d): d + 1 for d in range(10)}}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.Split("", behavior="isolated")
    tok.decoder = decoders.Fuse()
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        unk_token="[UNK]",
        eos_token="<|im_end|>",
        pad_token="<|endoftext|>",
        padding_side="left",
    )
    tokenizer.add_tokens([p for p in pieces if p not in tokenizer.get_vocab()])
    tokenizer.chat_template = chat_template
    ids = {p: tokenizer.convert_tokens_to_ids(p) for p in pieces}
    chain = {
        ids["<|im_start|>assistant\n"]: ids[_CALL_HEAD],
        ids[_CALL_HEAD]: ids[CODE],
        ids[CODE]: ids[_CALL_TAIL if calls_per_turn == 1 else _SECOND_TAIL],
        ids[_CALL_TAIL]: ids["<|im_end|>"],
        ids[_SECOND_TAIL]: ids[_SECOND_HEAD],
        ids[_SECOND_HEAD]: ids[_SECOND_CODE],
        ids[_SECOND_CODE]: ids[_CALL_TAIL],
    }
    vocab = len(tokenizer)
    hidden = max(32, vocab + (-vocab % 8))
    config = LlamaConfig(
        vocab_size=vocab,
        hidden_size=hidden,
        intermediate_size=hidden,
        num_hidden_layers=1,
        num_attention_heads=2,
        num_key_value_heads=2,
        max_position_embeddings=1024,
        tie_word_embeddings=False,
        pad_token_id=tokenizer.pad_token_id,
        eos_token_id=tokenizer.eos_token_id,
        bos_token_id=None,
    )
    torch.manual_seed(0)
    model = LlamaForCausalLM(config)
    with torch.no_grad():
        for layer in model.model.layers:
            layer.self_attn.o_proj.weight.zero_()
            layer.mlp.down_proj.weight.zero_()
        model.model.embed_tokens.weight.copy_(torch.eye(vocab, hidden))
        model.model.norm.weight.fill_(1.0)
        head = torch.zeros(vocab, hidden)
        for i in range(vocab):  # every other token ends the turn
            head[chain.get(i, ids["<|im_end|>"]), i] = 50.0
        model.lm_head.weight.copy_(head)
    model.generation_config.pad_token_id = tokenizer.pad_token_id
    model.generation_config.eos_token_id = tokenizer.eos_token_id
    return model, tokenizer


#: A small Hermes/Qwen-style chat template (tools in the system turn, calls
#: in <tool_call> tags, results as <tool_response> in a user turn).
HERMES_TEMPLATE = (
    "{% if tools %}<|im_start|>system\n# Tools\n<tools>\n"
    "{% for tool in tools %}{{ tool | tojson }}\n{% endfor %}"
    "</tools><|im_end|>\n{% endif %}"
    "{% for message in messages %}"
    "{% if message.role == 'tool' %}"
    "<|im_start|>user\n<tool_response>\n{{ message.content }}\n</tool_response><|im_end|>\n"
    "{% elif message.role == 'assistant' %}<|im_start|>assistant\n{{ message.content }}"
    "{% for call in message.tool_calls or [] %}<tool_call>\n"
    '{"name": "{{ call.function.name }}", "arguments": {{ call.function.arguments | tojson }}}'
    "\n</tool_call>{% endfor %}<|im_end|>\n"
    "{% else %}<|im_start|>{{ message.role }}\n{{ message.content }}<|im_end|>\n{% endif %}"
    "{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
