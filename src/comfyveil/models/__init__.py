"""Model files on a GPU host: which a workflow's [[models]] lack, and installing them.

    local.py    what lies under ComfyUI's models/ (present, missing, wrong size or hash),
                disk space, and the one command line that installs what is missing
    hub.py      one verified download from a Hugging Face hub (or a mirror)

Runs on the GPU host, which has no database: nothing here imports the store.
"""
