# The suite's fixtures and options come from the attnverify pytest plugin (entry point pytest11).
