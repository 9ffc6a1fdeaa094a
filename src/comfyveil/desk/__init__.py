"""The front desk: what every front end (the Telegram bot, the web pages) shares and
none owns. Who may do what, which commands exist and may run, validating and queueing a
job, cancelling and forgetting it, and the words a user reads about it, in their
language. The desk knows no front end: nothing here imports telegram/ or web/.
"""
