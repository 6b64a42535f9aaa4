"""The `ladle` command: serve | generate | chat | bench | quantize, and the flags they share.

Kept empty: `ladle serve`'s API process imports only what its subcommand needs."""
