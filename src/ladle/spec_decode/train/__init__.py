"""`ladle train-draft`: training an EAGLE-3 draft head on the target's own answers.

data.py         prompts (ShareGPT, a file), the target's answers, the draft vocabulary
features.py     the target's fused-layer and final hidden states for each sequence
eagle3_head.py  the head in plain torch (its state dict is the checkpoint) and its config
trainer.py      the training-time-test unrolled loss and the optimizer step
acceptance.py   held-out acceptance length, drafted as inference drafts
layout.py       the vLLM / SGLang checkpoint folder (config.json + model.safetensors)
pipeline.py     all of it in order: TrainDraftOptions, train_draft()
"""
