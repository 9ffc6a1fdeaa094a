"""The web front end: server-rendered pages that work with JavaScript off.

A second front end beside Telegram (DESIGN.md section 9). Its accounts are users of the
same store: their jobs go into the same table through the same functions, so the queue,
fairness, quotas, retention and forgetting are the bot's own.
"""
