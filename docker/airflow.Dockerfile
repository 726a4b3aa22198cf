# Airflow image for Tidemark's scale-out mode (see docker-compose.yaml).
FROM apache/airflow:3.3.2-python3.11

USER root
# A JRE is needed because spark-submit (pyspark) starts a JVM inside Airflow tasks.
# The man1 directory is missing on Debian slim and the JRE's postinst writes into it.
# The symlink gives one JAVA_HOME on both amd64 and arm64.
RUN mkdir -p /usr/share/man/man1 \
    && apt-get update \
    && apt-get install -y --no-install-recommends openjdk-17-jre-headless \
    && ln -sfn "/usr/lib/jvm/java-17-openjdk-$(dpkg --print-architecture)" /usr/lib/jvm/java-17 \
    && apt-get autoremove -yqq --purge \
    && apt-get clean \
    && rm -rf /var/lib/apt/lists/*
ENV JAVA_HOME=/usr/lib/jvm/java-17
USER airflow

COPY requirements.txt /requirements.txt
# Pinning apache-airflow stops a requirement from silently up- or downgrading it.
RUN pip install --no-cache-dir "apache-airflow==${AIRFLOW_VERSION}" -r /requirements.txt
