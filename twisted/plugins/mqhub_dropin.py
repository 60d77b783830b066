"""twistd drop-in: ``twistd mqhub`` (the options and service live in mqhub.tap)."""

from twisted.application.service import ServiceMaker

mqhub = ServiceMaker("mqhub", "mqhub.tap", "Multi-protocol message hub (NSQ, NATS/mq9, eMQP, MQKS, VibeMQ)", "mqhub")
