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


def build(chat_template: str) -> tuple[Any, Any]:
    """(model, tokenizer) for ``chat_template`` (a Qwen-style template)."""
    pieces = [
        "<|im_start|>",
        "<|im_end|>",
        "<|endoftext|>",
        "<|im_start|>assistant\n",
        _CALL_HEAD,
        CODE,
        _CALL_TAIL,
    ]
    tok = Tokenizer(models.WordLevel({"[UNK]": 0}, unk_token="[UNK]"))
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
        ids[CODE]: ids[_CALL_TAIL],
        ids[_CALL_TAIL]: ids["<|im_end|>"],
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
