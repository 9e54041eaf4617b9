"""Ansible plumbing: inventory rendering, playbook runs, events -> progress."""
