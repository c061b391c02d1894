"""Old name of the verify stage's package (rsgen.verify since issue 37; the verifiers are rsgen.verifiers)."""

raise ImportError("rsgen.verification is now rsgen.verify (the verify stage); the verifiers are rsgen.verifiers")
