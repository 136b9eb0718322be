"""Waits for people (issue 29): a question a person decides, and the pages they decide it on.

``spec`` parses ``for: {"people": ...}``; ``schema`` is the small, safe subset of JSON Schema an edit's
arguments are checked against; ``links`` makes and spends signed decision links; ``notify`` tells the
people through todos/notices.py; ``views`` are the decision page and the inbox. The transitions (decide,
reassign, remind, escalate) are in todos/queue/people.py, their statements in todos/sql/people.py.
"""
