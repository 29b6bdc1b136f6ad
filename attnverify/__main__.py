from attnverify.cli import entry

entry()
