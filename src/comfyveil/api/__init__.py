"""The third front end: OpenAI's Images API (``/v1/images/generations``, ``/edits``,
``/v1/models``) over the desk, so tools written for OpenAI's SDK (Open WebUI, LibreChat,
scripts) run the operator's workflows on their GPUs. A key belongs to a web account, and
its jobs are the account's: same queue, limits, policy, history and forgetting. Mounted
by the web process under ``/v1``; imports the desk and the lower floors, never another
front end.
"""
