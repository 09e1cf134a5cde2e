"""LoRA adapters served on one copy of a base model's weights (docs/lora.md): PEFT adapter
directories read and checked (peft_files.py), their low-rank updates applied to the rows of a
step that use them (rows.py), the options that enable it (settings.py)."""
