"""The speculative algorithm as tensor functions: propose (drafter → drafts), verify/accept."""
