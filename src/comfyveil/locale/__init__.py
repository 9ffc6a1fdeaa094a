"""The bot's translations: ``messages.pot`` (extracted) and ``LANG/LC_MESSAGES/messages.po``.

Maintained with ``python -m comfyveil.locale.catalogs`` (see that module); read at run
time by :mod:`comfyveil.i18n`.
"""
