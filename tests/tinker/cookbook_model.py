"""cookbook_model.py — a tiny random Llama with a real tokenizer, built here
(no model hub), for tinker-cookbook's loops: a byte-level BPE of 400 tokens
trained with the `tokenizers` library on a small generated corpus, with the
Llama 3 chat special tokens (the cookbook's "llama3" renderer, whose stop
sequence is the <|eot_id|> token), saved with the model in one directory.
The cookbook's model_name is that directory: tokenizer_utils.get_tokenizer
loads it from disk, and the gateway serves it under that name.

initializer_range 0.1 rather than Llama's 0.02: engined's LoRA does not
reach the unembedding (the SDK's train_unembed is ignored), so on a random
model the unembedding's scale bounds how far LoRA alone moves the logits."""
import random

VOCAB = 400
SPECIALS = ["<|begin_of_text|>", "<|end_of_text|>", "<|start_header_id|>",
            "<|end_header_id|>", "<|eot_id|>", "<|pad|>"]
WORDS = ("the a cat dog bird sees likes eats runs jumps red blue green big small "
         "happy sad one two three four five yes no hello world what is color of "
         "sky grass sun moon you i we they answer question user assistant system").split()


def corpus(n=400, seed=0):
    rng = random.Random(seed)
    lines = [" ".join(rng.choice(WORDS) for _ in range(rng.randint(3, 12))) for _ in range(n)]
    return lines + ["%s\n\n" % role for role in ("system", "user", "assistant")]


def save(model_dir, seed=0):
    """Write the tokenizer and the model into model_dir; the tokenizer."""
    import torch
    import transformers
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.train_from_iterator(corpus(), trainers.BpeTrainer(
        vocab_size=VOCAB, special_tokens=SPECIALS, show_progress=False,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    fast = transformers.PreTrainedTokenizerFast(
        tokenizer_object=tok, bos_token="<|begin_of_text|>", eos_token="<|eot_id|>",
        pad_token="<|pad|>")
    fast.save_pretrained(model_dir)
    torch.manual_seed(seed)
    ids = fast.convert_tokens_to_ids
    cfg = transformers.LlamaConfig(
        vocab_size=len(fast), hidden_size=64, intermediate_size=128, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256,
        bos_token_id=ids("<|begin_of_text|>"), eos_token_id=ids("<|eot_id|>"),
        pad_token_id=ids("<|pad|>"), tie_word_embeddings=False, initializer_range=0.1)
    transformers.LlamaForCausalLM(cfg).save_pretrained(model_dir)
    return fast
