"""Data-parallel ladle replicas behind one OpenAI endpoint, on Ray Serve (`ladle serve
--replicas N`, or `build_app(...)` for a `serve run` config). Only prefix_routing.py works without
Ray; the rest needs the `ray` extra (`pip install 'ladle[ray]'`)."""
