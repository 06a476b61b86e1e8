"""A GPT as nanoGPT's model.py writes it (our own code, nanoGPT's architecture), for the tests
that hold traind's GPT preset against PyTorch: token and position embeddings, pre-LayerNorm
blocks of causal self-attention (one QKV projection, the non-flash path: PyTorch 1.13 has no
scaled_dot_product_attention) and a 4x MLP with exact GELU, a final LayerNorm, the head tied to
the token embedding; `bias` on or off as nanoGPT's GPTConfig has it (torch 1.13's nn.LayerNorm
cannot drop its bias, hence the small LayerNorm below); GPT-2's initialisation.
"""
import math

import torch
import torch.nn as nn
import torch.nn.functional as F


class LayerNorm(nn.Module):
    def __init__(self, n, bias):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(n))
        self.bias = nn.Parameter(torch.zeros(n)) if bias else None

    def forward(self, x):
        return F.layer_norm(x, self.weight.shape, self.weight, self.bias, 1e-5)


class CausalSelfAttention(nn.Module):
    def __init__(self, n_embd, n_head, block_size, bias=True):
        super().__init__()
        self.c_attn = nn.Linear(n_embd, 3 * n_embd, bias=bias)
        self.c_proj = nn.Linear(n_embd, n_embd, bias=bias)
        self.n_head = n_head
        self.register_buffer("bias", torch.tril(torch.ones(block_size, block_size))
                             .view(1, 1, block_size, block_size), persistent=False)

    def forward(self, x):
        b, t, c = x.size()
        q, k, v = self.c_attn(x).split(c, dim=2)
        q, k, v = (z.view(b, t, self.n_head, c // self.n_head).transpose(1, 2) for z in (q, k, v))
        att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(k.size(-1)))
        att = att.masked_fill(self.bias[:, :, :t, :t] == 0, float("-inf"))
        y = F.softmax(att, dim=-1) @ v
        return self.c_proj(y.transpose(1, 2).contiguous().view(b, t, c))


class Block(nn.Module):
    def __init__(self, n_embd, n_head, block_size, bias=True):
        super().__init__()
        self.ln_1 = LayerNorm(n_embd, bias)
        self.attn = CausalSelfAttention(n_embd, n_head, block_size, bias)
        self.ln_2 = LayerNorm(n_embd, bias)
        self.mlp = nn.ModuleDict(dict(c_fc=nn.Linear(n_embd, 4 * n_embd, bias=bias),
                                      c_proj=nn.Linear(4 * n_embd, n_embd, bias=bias)))

    def forward(self, x):
        x = x + self.attn(self.ln_1(x))
        return x + self.mlp.c_proj(F.gelu(self.mlp.c_fc(self.ln_2(x))))


class GPT(nn.Module):
    def __init__(self, vocab=11, block_size=8, n_embd=8, n_head=2, n_layer=1, bias=True):
        super().__init__()
        self.block_size = block_size
        self.transformer = nn.ModuleDict(dict(
            wte=nn.Embedding(vocab, n_embd), wpe=nn.Embedding(block_size, n_embd),
            h=nn.ModuleList([Block(n_embd, n_head, block_size, bias) for _ in range(n_layer)]),
            ln_f=LayerNorm(n_embd, bias)))
        self.lm_head = nn.Linear(n_embd, vocab, bias=False)
        self.transformer.wte.weight = self.lm_head.weight

    def gpt2_init(self, n_layer):
        """normal(0, 0.02) for Linear and Embedding weights, zero biases, the residual
        projections at 0.02 / sqrt(2 n_layer), as nanoGPT's _init_weights."""
        for name, p in self.named_parameters():
            if name.endswith("c_proj.weight"):
                nn.init.normal_(p, 0.0, 0.02 / math.sqrt(2 * n_layer))
            elif p.dim() >= 2:
                nn.init.normal_(p, 0.0, 0.02)
            elif name.endswith("bias"):
                nn.init.zeros_(p)
            else:
                nn.init.ones_(p)

    def forward(self, idx):
        t = idx.size(1)
        x = self.transformer.wte(idx) + self.transformer.wpe(torch.arange(t))
        for block in self.transformer.h:
            x = block(x)
        return self.lm_head(self.transformer.ln_f(x))
