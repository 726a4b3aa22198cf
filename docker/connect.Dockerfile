# Kafka Connect for Tidemark's scale-out mode (see docker-compose.yaml): the broker's own image,
# which ships connect-distributed.sh, plus Debezium's PostgreSQL connector in the plugin path,
# resolved with Maven from the same pom the local stack uses (stack/connect/debezium/pom.xml), and
# Tidemark's converter that signs every change record, built and tested by Maven from its module of the
# Java build (stack/java/signing) against the worker's Connect API.
FROM maven:3.9-eclipse-temurin-17 AS plugins
COPY stack/connect/debezium/pom.xml /build/pom.xml
RUN mvn -q -B -f /build/pom.xml dependency:copy-dependencies -DincludeScope=runtime \
        -DoutputDirectory=/plugins/debezium-postgres \
    # the worker provides Kafka's and Connect's APIs: a plugin's own copies would shadow them
    && rm -f /plugins/debezium-postgres/connect-api-*.jar /plugins/debezium-postgres/kafka-clients-*.jar \
             /plugins/debezium-postgres/slf4j-api-*.jar
# the reactor reads every module's pom; only the signing module is built (-pl), its tests run, from clean
# (a target/ directory of the build context is not trusted)
COPY stack/java/pom.xml /build/java/pom.xml
COPY stack/java/udf/pom.xml /build/java/udf/pom.xml
COPY stack/java/signing /build/java/signing
RUN mvn -q -B -f /build/java/pom.xml -pl signing clean package \
    && mkdir -p /plugins/tidemark-signing \
    && cp /build/java/signing/target/tidemark-signing.jar /plugins/tidemark-signing/tidemark-signing.jar

FROM apache/kafka:4.1.1
COPY --from=plugins /plugins /opt/connect/plugins
COPY docker/connect-worker.properties /opt/connect/worker.properties
CMD ["/opt/kafka/bin/connect-distributed.sh", "/opt/connect/worker.properties"]
