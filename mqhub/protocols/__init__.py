"""Built-in wire protocols, one package each: a sans-IO codec plus a thin Twisted adapter."""
