# Kafka Connect for Tidemark's scale-out mode (see docker-compose.yaml): the broker's own image,
# which ships connect-distributed.sh, plus Debezium's PostgreSQL connector in the plugin path,
# resolved with Maven from the same pom the local stack uses (stack/connect/debezium/pom.xml), and
# Tidemark's converter that signs every change record (stack/connect/signing), compiled against the
# worker's jars (stack/connect/pom.xml).
FROM maven:3.9-eclipse-temurin-17 AS plugins
COPY stack/connect/debezium/pom.xml /build/pom.xml
RUN mvn -q -B -f /build/pom.xml dependency:copy-dependencies -DincludeScope=runtime \
        -DoutputDirectory=/plugins/debezium-postgres \
    # the worker provides Kafka's and Connect's APIs: a plugin's own copies would shadow them
    && rm -f /plugins/debezium-postgres/connect-api-*.jar /plugins/debezium-postgres/kafka-clients-*.jar \
             /plugins/debezium-postgres/slf4j-api-*.jar
COPY stack/connect/pom.xml /build/worker/pom.xml
COPY stack/connect/signing /build/signing
RUN mvn -q -B -f /build/worker/pom.xml dependency:copy-dependencies -DincludeScope=runtime \
        -DoutputDirectory=/build/worker/libs \
    && mkdir -p /build/classes /plugins/tidemark-signing \
    && javac --release 17 -nowarn -cp '/build/worker/libs/*' -d /build/classes \
        $(find /build/signing -name '*.java') \
    && cp -r /build/signing/META-INF /build/classes/ \
    && jar cf /plugins/tidemark-signing/tidemark-signing.jar -C /build/classes .

FROM apache/kafka:4.1.1
COPY --from=plugins /plugins /opt/connect/plugins
COPY docker/connect-worker.properties /opt/connect/worker.properties
CMD ["/opt/kafka/bin/connect-distributed.sh", "/opt/connect/worker.properties"]
