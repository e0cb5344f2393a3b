"""``fedgraph-supernode`` that stores each incoming message ``DELAY_S`` late.

Flower's SuperNode creates a message's ClientApp task before it stores the message; on a
loaded host a forked ClientApp can ask for the message in between. This entry point
widens that gap on purpose (tests/test_deploy.py) so that the race always happens:
``python tests/supernode_storing_late.py <fedgraph-supernode flags>``.
"""

import sys
import time

from flwr.supernode.nodestate.in_memory_nodestate import InMemoryNodeState

from fedgraph_flwr.engine.accelerate import supernode_main

DELAY_S = 0.5

store_message = InMemoryNodeState.store_message


def store_message_late(self, message):
    if not message.metadata.reply_to_message_id:  # a message from the server, not a reply
        time.sleep(DELAY_S)
    return store_message(self, message)


InMemoryNodeState.store_message = store_message_late

if __name__ == "__main__":
    supernode_main(sys.argv[1:])
