"""The Anyone Network: the anon binary, its process and control port, SOCKS routing.

    install.py   pinned npm package -> DATA_DIR/anon/{anon,anon-gencert,geoip,geoip6}
    network.py   PrivateNetwork / PublicNetwork: anon never starts without one
    daemon.py    AnonClient (what a running anon gives us) and AttachedAnon (the operator's)
    process.py   ManagedAnon (our supervised process); from_settings picks one
    control.py   asyncio control-port client
    hidden.py    hidden services and client-authorization keys
    routing.py   proxy_url_for(backend, anon), telegram_proxy_url(settings, anon)
    runtime.py   anon_for(settings, backends): start anon only when something needs it
"""
