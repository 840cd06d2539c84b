"""Chat templates as data files (see README.md); loaded by ``models.chat.qwen3_chat_template``."""
