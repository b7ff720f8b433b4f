"""What every layer of inferwire needs and none owns: the command line's argument validators and
error reporting (:mod:`.arguments`), the event-loop choice (:mod:`.loops`), the messages that
name a missing extra (:mod:`.extras`), a child process that announces its address
(:mod:`.child`), and ending a long-running command on a signal (:mod:`.signals`).

It sits below every other layer and imports none of them.
"""
