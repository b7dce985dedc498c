"""Code shared by several test modules (no tests here): each module is named for what it
holds. Test modules import it as `helpers.<module>` (pytest puts tests/ on sys.path)."""
